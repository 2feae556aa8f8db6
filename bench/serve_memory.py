"""Resident memory of the serving engine under batches of varied shape, by --pad-multiple.

The soak of bench/serve_load.py saw a server's resident memory climb for minutes (+74% in 10
minutes) with nothing leaked. The suspect is shape diversity: each new (rows, tokens) shape of a
batch gives oneDNN's primitive cache new entries and glibc's heap new block sizes. This script
measures it without HTTP: for each --pad-multiple, a fresh process (torch pinned to --threads)
loads the Engine with the 8 heads of serve_load.py (bench/runs/serve-models/heads, made there) and
classifies --batches requests of 1 to 16 SST-2 test texts each (seeded draws, one request = one
batch), reading its RSS every 100 batches.

  python bench/serve_memory.py                        # --pad-multiple 1,16, 1500 batches each (≈ 6 min)

Results: bench/results/serve_memory.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from serve_load import HEADS as SERVED, MODELS, short_texts  # the heads serve_load.py trains, and its texts

HERE = Path(__file__).resolve().parent
HEADS = [name for name, _, _ in SERVED]


def one(multiple: int, batches: int, threads: int, models: Path, spans: str = "valid", rows: int = 64) -> dict:
    """In this process: the engine's RSS every 100 batches, and the time taken. spans: "valid" (the
    self-explaining heads' default: only valid spans, a row count that varies with every batch) or
    "every" (every (i, w) slot, shapes from the padded batch alone, as before that change). rows: the
    packed pass's row multiple (extract/packed.py ROWS; 1 = the exact token count), 0 = packing off."""
    import psutil
    import torch
    from frozentune.serve import Engine, ServeOptions

    from frozentune.extract import packed

    torch.set_num_threads(threads)
    packed.ROWS = max(rows, 1)
    engine = Engine.load([models / n for n in HEADS], options=ServeOptions(pad_multiple=multiple, pack_tokens=rows > 0),
                         log=lambda m: None)
    for task in engine.tasks.values():
        if hasattr(task.model.head, "every_slot"):
            task.model.head.every_slot = spans == "every"
    texts = short_texts()
    rng, proc, series = random.Random(0), psutil.Process(), []
    t0 = time.perf_counter()
    try:
        for i in range(batches):
            if i % 100 == 0:
                series.append([i, round(proc.memory_info().rss / 2**20, 1)])
            engine.classify(rng.sample(texts, rng.randint(1, 16)))
        series.append([batches, round(proc.memory_info().rss / 2**20, 1)])
    finally:
        engine.close()
    return {"pad_multiple": multiple, "spans": spans, "packed_rows": rows, "seconds": round(time.perf_counter() - t0, 1), "rss_series_mb": series}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pad-multiple", default="1,16", help="comma list; each runs in its own process")
    ap.add_argument("--batches", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", type=Path, default=MODELS / "heads")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "serve_memory.json")
    ap.add_argument("--spans", default="valid", help="comma list of the self-explaining heads' span modes: valid "
                                                     "(the default: only valid spans), every (every slot)")
    ap.add_argument("--packed-rows", default="64", help="comma list: the packed pass's row multiple (1: the exact "
                                                          "token count), 0 = packing off (--no-pack-tokens)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.batches < 100:
        ap.error(f"--batches {a.batches}: give at least 100 (memory is read every 100 batches, and compared from batch 100)")
    if a.child is not None:
        print(json.dumps(one(a.child, a.batches, a.threads, a.models, a.spans, int(a.packed_rows))))
        return 0
    missing = [n for n in HEADS if not (a.models / n).is_dir()]
    if missing:
        sys.exit(f"{a.models}: no {', '.join(missing)}; run python bench/serve_load.py --only heads first (it trains them)")
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    runs = []
    for m, spans, rows in ((int(x), s, r) for x in a.pad_multiple.split(",") for s in a.spans.split(",")
                           for r in a.packed_rows.split(",")):
        cmd = [sys.executable, __file__, "--child", str(m), "--batches", str(a.batches), "--threads", str(a.threads),
               "--models", str(a.models), "--spans", spans, "--packed-rows", rows]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(runs[-1], flush=True)
    import torch
    result = {"command": "python bench/serve_memory.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
              "threads": a.threads, "batches": a.batches, "torch": torch.__version__, "runs": runs}
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=1))
    a.output.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {a.output} and {a.output.with_suffix('.md')}")
    return 0


def _pass(run: dict) -> str:
    rows = run.get("packed_rows", 0)  # runs before the packed pass: padded
    return "padded" if rows == 0 else f"packed, rows × {rows}"


def markdown(r: dict) -> str:
    lines = ["# Serving engine memory under varied batch shapes (bench/serve_memory.py)", "",
             f"`{r['command']}` ({r['date']}; torch {r['torch']}, {r['threads']} thread(s); one process per row; "
             f"{r['batches']} batches of 1-16 SST-2 test texts, seeded, on the 8 heads of serve_load.py).", "",
             "| --pad-multiple | self-explaining spans | pass | seconds | RSS at batch 0 MB | at 100 | at end | end / at 100 |",
             "|---:|---|---|---:|---:|---:|---:|---:|"]
    for run in r["runs"]:
        s = dict((i, v) for i, v in run["rss_series_mb"])
        lines.append(f"| {run['pad_multiple']} | {run.get('spans', 'every')} | {_pass(run)} | {run['seconds']} | {s[0]:.0f} | "
                     f"{s[100]:.0f} | {s[r['batches']]:.0f} | {s[r['batches']] / s[100]:.2f}x |")
    lines += ["", "RSS every 100 batches (MB):", ""]
    lines += [f"- {run['pad_multiple']}, spans {run.get('spans', 'every')}, {_pass(run)}: " + ", ".join(f"{v:.0f}" for _, v in run["rss_series_mb"]) for run in r["runs"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
