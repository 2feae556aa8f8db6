"""`frozentune predict --input FILE` on many long texts: peak memory, time to the first row and rows a
second, with the rows written a chunk at a time (api.PREDICT_CHUNK, the default since 2026-11-27) against
one chunk holding every input (how predict ran before: every text tokenised and scored, then printed).

Each setting runs as its own `frozentune predict` process (its peak RSS is its own, read from
/proc/PID/status VmHWM as it ends), settings alternating for --repeats rounds. The model is the probe at
layer 4 of MiniLM that bench/serve_load.py trains on SST-2 (bench/runs/serve-models/heads/probe-l4, made
when missing); the inputs are the first --texts IMDB test reviews, one per line (cut at the model's 128
tokens, as predict reads them).

  OMP_NUM_THREADS=1 python bench/predict_stream.py --threads 1 --texts 6000 --repeats 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import serve_load  # noqa: E402  (its heads: trained once into bench/runs/serve-models)
from run import machine, write_result  # noqa: E402

RUNNER = """
import json, os, sys, time
from frozentune import api
api.PREDICT_CHUNK = int(sys.argv[3])
from frozentune.cli import main
t0 = time.perf_counter()
class Timed:
    def __init__(self, out):
        self.out, self.first, self.rows = out, None, 0
    def write(self, s):
        if self.first is None and s.strip():
            self.first = time.perf_counter() - t0
        self.rows += s.count("\\n")
        return self.out.write(s)
    def flush(self):
        self.out.flush()
sys.stdout = timed = Timed(open(os.devnull, "w"))
code = main(["predict", "--model", sys.argv[1], "--input", sys.argv[2]])
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"code": code, "first_row_s": timed.first, "seconds": time.perf_counter() - t0,
                  "rows": timed.rows, "peak_rss_mb": hwm / 1024}), file=sys.stderr)
"""


def one(model: Path, inputs: Path, chunk: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", RUNNER, str(model), str(inputs), str(chunk)], env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stderr.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--texts", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "predict_stream")
    a = ap.parse_args()
    from frozentune import api

    model = serve_load.MODELS / "heads" / "probe-l4"
    serve_load.train_heads(serve_load.MODELS / "heads")  # trained when missing
    from frozentune.data import data_root, read_split

    texts = list(read_split(data_root() / "imdb" / "test.jsonl").texts)[:a.texts]
    settings = {"chunks": api.PREDICT_CHUNK, "one chunk": len(texts)}
    runs: dict[str, list[dict]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "imdb_test.txt"
        inputs.write_text("".join(" ".join(t.split()) + "\n" for t in texts), encoding="utf-8")
        for r in range(a.repeats):
            for name, chunk in settings.items():
                got = one(model, inputs, chunk, a.threads)
                print(f"repeat {r + 1}, {name} ({chunk:,} a chunk): {got}", flush=True)
                runs[name].append(got)
    command = f"OMP_NUM_THREADS={a.threads} python bench/predict_stream.py --threads {a.threads} --texts {a.texts} " \
              f"--repeats {a.repeats}"
    lines = [f"`{command}` — {machine(a.threads)}; {a.texts:,} IMDB test reviews, one per line; probe-l4 (MiniLM, "
             f"128 tokens); {a.repeats} runs each, alternating", "",
             "| rows written | peak RSS (MB) | first row after (s) | whole run (s) | rows/s |", "|---|---:|---:|---:|---:|"]
    for name, chunk in settings.items():
        rs = runs[name]
        def cells(value, spec: str) -> str:
            return ", ".join(format(value(x), spec) for x in rs)

        lines.append(f"| {name} ({chunk:,} inputs) | {cells(lambda x: x['peak_rss_mb'], ',.0f')} | "
                     f"{cells(lambda x: x['first_row_s'], '.1f')} | {cells(lambda x: x['seconds'], '.1f')} | "
                     f"{cells(lambda x: x['rows'] / x['seconds'], '.0f')} |")
    write_result(a.out, {"command": command, "machine": machine(a.threads), "date": time.strftime("%Y-%m-%d"),
                         "texts": a.texts, "settings": settings, "runs": runs}, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
