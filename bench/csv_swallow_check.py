"""Does the CSV rule that refuses rows swallowed by an unmatched quote (data._swallowed) refuse real
multi-line texts? IMDB train reviews (the first N), their `<br />` turned into line breaks, written with
Python's csv.writer (quoted where needed) in both column orders, then read back with read_records.

    python bench/csv_swallow_check.py            # 3,000 reviews, three ways of breaking lines

Prints, per variant and column order: rows read, whether they equal the rows written, and how many
texts span lines; or the refusal. Nothing is written outside a temporary folder.
"""
from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

from frozentune.data import DataError, data_root, read_records

VARIANTS = {
    "<br /><br /> as a blank line": lambda t: t.replace("<br /><br />", "\n\n"),
    "<br /><br /> as one line break": lambda t: t.replace("<br /><br />", "\n"),
    "and a break after every ', '": lambda t: t.replace("<br /><br />", "\n").replace(", ", ",\n"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    a = ap.parse_args()
    with open(data_root() / "imdb" / "train.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(a.n), f)]
    for name, change in VARIANTS.items():
        written = [(change(r["text"]), r["label"]) for r in rows]
        spanning = sum("\n" in t for t, _ in written)
        with tempfile.TemporaryDirectory() as d:
            for order, header in (("text,label", ["text", "label"]), ("label,text", ["label", "text"])):
                path = Path(d) / f"{order.replace(',', '-')}.csv"
                with open(path, "w", newline="", encoding="utf-8") as f:
                    w = csv.writer(f)
                    w.writerow(header)
                    w.writerows(written if header[0] == "text" else [(b, t) for t, b in written])
                try:
                    back = [(r["text"], r["label"]) for _, r in read_records(path)]
                    print(f"{name} ({order}): {len(back)} rows read, equal to those written: {back == written}; "
                          f"{spanning} texts span lines")
                except DataError as e:
                    print(f"{name} ({order}): REFUSED: {str(e)[:300]}")


if __name__ == "__main__":
    main()
