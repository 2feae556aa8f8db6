"""How many rows of a carved split had a copy (the same text, spacing and case aside) left in train,
with the plain stratified carve frozentune used before and with grouped_split, which it uses now.

    python bench/carve_copies.py trec imdb rte snli     # named datasets whose validation split is carved
"""
from __future__ import annotations

import sys

from frozentune.data import _text_key, grouped_split, load_classification, read_split, resolve, stratified_split


def main(names: list[str]) -> None:
    print("| data | rows | carved (10%) | rows repeating an earlier text | carved rows with a copy in train: before | now |")
    print("|---|---|---|---|---|---|")
    for name in names:
        ds = load_classification(name)  # the fields the dataset is read with
        _, files = resolve(name)
        s = read_split(files.get("train") or files["validation"], ds.text_field, "label", ds.pair_field)
        keys = [_text_key(t) for t in s.texts]
        counts = []
        for keep, carve in (stratified_split(s.labels, 0.1, 0), grouped_split(s.texts, s.labels, 0.1, 0)[:2]):
            kept = {keys[i] for i in keep}
            counts.append(sum(keys[i] in kept for i in carve))
        copies = grouped_split(s.texts, s.labels, 0.1, 0)[2]
        print(f"| {name} | {len(s):,} | {len(carve):,} | {copies:,} | {counts[0]:,} | {counts[1]:,} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["trec", "imdb", "rte", "snli"])
