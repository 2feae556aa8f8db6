"""Sentence pairs (issue 22): every method on SNLI, RTE and MRPC with the pair encoded as a pair,
against the same pair glued into one text (the workaround before pair input), same run, same seeds.

  OMP_NUM_THREADS=1 python bench/pairs.py --methods probe,ytuning,space,selfexplain     # resumes: done cells kept
  OMP_NUM_THREADS=1 python bench/pairs.py --methods finetune,prefix --data rte --max-train 1000 --epochs 2 --seeds 0
  OMP_NUM_THREADS=1 python bench/pairs.py --methods selfexplain --unfrozen --lr 5e-5 --data rte --max-train 1000 --epochs 2 --seeds 0 --inputs pair
  python bench/pairs.py --report                                                        # results/pairs.md

Data (../shared/data): SNLI trains on its validation file (9,842; 10% carved as validation,
seeded) and is scored on test (9,824); RTE trains on train (2,490; 10% carved) and is scored on the
GLUE dev set (277); MRPC trains on train (3,668), early-stops on validation (408) and is scored on
MSR's labelled test (1,725), with F1 of `equivalent` beside accuracy.

"pair": `load_classification(name)` reads the two fields as a pair (what `frozentune train
--data snli` does). "glued": the same splits with each pair replaced by `first + " " + second`
(one text, no separator, no token types). "sep" (an ablation, `--inputs sep`): glued with
" [SEP] ", which MiniLM's tokenizer reads as its separator: the pair's token ids with every token
type 0 (and truncation from the end), i.e. pair encoding without the second segment's embedding.
"untyped" (`--inputs untyped`): the pair encoding with `--no-token-types` (BackboneOptions(token_types=
False)): the pair's ids and truncation, every token type 0. Each cell is `api.train` with the method's defaults,
except `--epochs` (a cap, stated in the table) and `--max-train` where given. Results are
appended to results/pairs.jsonl one cell at a time.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "pairs.jsonl"
DATA = ("snli", "rte", "mrpc")


def glued(ds, joiner: str = " "):
    """The dataset with every pair glued into one text (with `joiner` between); splits that shared a
    file still share one list (so they share one cache entry, as the pair splits do)."""
    import dataclasses

    from frozentune.data import TextSplit
    from frozentune.pairs import glue

    files: dict[int, list[str]] = {}

    def one(split: TextSplit) -> TextSplit:
        key = id(split.file_texts)
        if key not in files:
            files[key] = [glue(t, joiner) for t in split.file_texts]
        return TextSplit([glue(t, joiner) for t in split.texts], split.labels, split.source + " (glued)", split.lines,
                         files[key], split.rows)

    return dataclasses.replace(ds, train=one(ds.train), validation=one(ds.validation), test=one(ds.test),
                               text_field=f"{ds.text_field}+{ds.pair_field} glued", pair_field=None)


def done_cells(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    return {(r["data"], r["method"], r["input"], r["seed"], r["max_train"], r["epochs"])
            for r in map(json.loads, path.read_text().splitlines()) if r}


def run(args) -> None:
    import torch

    from frozentune import api
    from frozentune.data import load_classification

    torch.set_num_threads(args.threads)
    done = done_cells(args.out)
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in args.data.split(","):
            base = load_classification(name, seed=seed, max_train=args.max_train)
            variants = {"pair": base, "glued": glued(base),
                        # the pair's own ids (the tokenizer reads "[SEP]" as its separator) but every token
                        # type 0 and truncation from the end only: what the token types add
                        "sep": glued(base, " [SEP] "),
                        # the pair encoding fed without token types (frozentune's --no-token-types)
                        "untyped": base}
            for method in args.methods.split(","):
                for kind in args.inputs.split(","):
                    label = method + (" (unfrozen)" if args.unfrozen else "")
                    cell = (name, label, kind, seed, args.max_train, args.epochs)
                    if cell in done:
                        continue
                    t0 = time.perf_counter()
                    cfg = {"seed": seed, **({"epochs": args.epochs} if args.epochs else {}),
                           **({"lr": args.lr} if args.lr else {})}
                    r = api.train(method, variants[kind], api.BackboneOptions(token_types=kind != "untyped"),
                                  options={"train_backbone": True} if args.unfrozen else None,
                                  train_cfg=cfg, progress=False, log=lambda s: None)
                    row = {"data": name, "method": label, "lr": r["config"]["train"]["lr"], "input": kind, "seed": seed, "max_train": args.max_train,
                           "epochs": args.epochs, "accuracy": r["metrics"]["accuracy"],
                           "macro_f1": r["metrics"]["macro_f1"], "positive_f1": r["metrics"].get("positive_f1"),
                           "sizes": r["sizes"], "best_epoch": r["best_epoch"], "train_seconds": r["train_seconds"],
                           "extract_seconds": r["extract_seconds"], "wall_seconds": time.perf_counter() - t0,
                           "precision": r["config"]["backbone"]["precision"], "threads": args.threads,
                           "machine": platform.processor() or platform.machine(),
                           "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(["python"] + sys.argv)}
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"{name} {label} {kind} seed {seed}: acc {row['accuracy']:.2f}"
                          + (f" F1 {row['positive_f1']:.2f}" if row["positive_f1"] is not None else "")
                          + f" ({row['wall_seconds']:.0f}s)", flush=True)


def paired_diff(a: list[dict], b: list[dict]) -> str:
    """Mean ± std over the seeds both have of a's accuracy − b's (one seed's difference alone)."""
    seeds = sorted({r["seed"] for r in a} & {r["seed"] for r in b})
    if not seeds:
        return "–"
    d = np.array([next(r["accuracy"] for r in a if r["seed"] == s) - next(r["accuracy"] for r in b if r["seed"] == s)
                  for s in seeds])
    return f"{d.mean():+.1f}" + (f" ± {d.std(ddof=1):.1f}" if len(d) > 1 else "")


def report(path: Path) -> str:
    rows, seen = [], set()
    for r in (json.loads(x) for x in path.read_text().splitlines() if x):
        cell = (r["data"], r["method"], r["input"], r["seed"], r["max_train"], r["epochs"])
        if cell not in seen:  # two runs of one cell (processes that overlapped): the first counts
            seen.add(cell)
            rows.append(r)
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        groups.setdefault((r["data"], r["method"], r["max_train"], r["epochs"]), {}).setdefault(r["input"], []).append(r)
    lines = ["| data | method | train | epochs (cap) | seeds | pair: accuracy | glued: accuracy | pair − glued | "
             "pair, --no-token-types | no types − glued | [SEP]-glued, types 0 (seed 0) | pair: F1 (pos.) | "
             "glued: F1 (pos.) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ms(rs: list[dict], key: str) -> str:
        v = np.array([r[key] for r in rs if r.get(key) is not None], dtype=float)
        if not len(v):
            return "–"
        return f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" if len(v) > 1 else f"{v[0]:.1f}"

    order = ["probe", "ytuning", "space", "selfexplain", "prefix", "finetune"]
    for (data, method, max_train, epochs), by in sorted(
            groups.items(), key=lambda kv: (DATA.index(kv[0][0]), order.index(kv[0][1].split()[0]), kv[0][1])):
        p, g, sep, u = by.get("pair", []), by.get("glued", []), by.get("sep", []), by.get("untyped", [])
        seeds = {r["seed"] for r in p or g or u}  # of the main input (the differences use the seeds both have)
        n = (p or g or sep or u)[0]["sizes"]["train"]
        lines.append(f"| {data} | {method} | {n:,} | {epochs or 'default'} | {len(seeds)} | {ms(p, 'accuracy')} | "
                     f"{ms(g, 'accuracy')} | {paired_diff(p, g)} | {ms(u, 'accuracy')} | {paired_diff(u, g)} | "
                     f"{ms(sep, 'accuracy')} | {ms(p, 'positive_f1')} | {ms(g, 'positive_f1')} |")
    first = rows[0] if rows else {}
    head = (f"Commands: see bench/pairs.py; rows from {path.name} ({len(rows)} cells; {first.get('machine', '?')}, "
            f"{first.get('threads', '?')} torch thread(s), frozen pass in {first.get('precision', '?')}). Mean ± std over "
            f"seeds (sample std); pair − glued is the mean of per-seed differences.\n\n")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=",".join(DATA))
    ap.add_argument("--methods", default="probe,ytuning,space,selfexplain")
    ap.add_argument("--inputs", default="pair,glued")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epochs", type=int, help="cap on epochs (default: each method's own)")
    ap.add_argument("--max-train", type=int)
    ap.add_argument("--unfrozen", action="store_true", help="train the backbone with the head (train_backbone)")
    ap.add_argument("--lr", type=float, help="peak learning rate (default: each method's own)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        md = report(args.out)
        (args.out.with_suffix(".md")).write_text(md)
        print(md)
        return
    run(args)


if __name__ == "__main__":
    main()
