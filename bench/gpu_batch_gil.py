"""Where the 8-head server's batches lose time beside a busy event loop: one process, no HTTP (issue 17, GPU).

On a GPU at 32 clients the 8-head server answered 0.68-1.00× the requests/s of the 1-head one, and its
batcher thread spent 0.68 ms of CPU per request against 0.37 (bench/REPORT.md, "`--pipeline on` on a GPU,
two more repeats"), though in a quiet process the 8 heads add about 2 ms to a 16-row batch. Every torch call
lets Python's GIL go; beside the event loop's thread, which runs Python most of the time under load, the
batcher thread then waits to get it back, once per call. This measures that in one process with the
server's own engine (frozentune.serve.Engine: batcher thread, CUDA graphs as the server has them):

  heads     1 (probe-l4) or the 8 of bench/serve_load.py
  load      quiet: nothing else runs; busy: a thread that does an event loop's kind of work per request
            (tokenizing a text, json loads and dumps of a request and an 8-task answer) for --duty of
            its time and sleeps the rest
  switch    sys.setswitchinterval (Python's default is 5 ms): how long a thread that wants the GIL waits
            before the holder is made to let it go
  answers   one-copy: the heads' scores read from the device in one copy per batch (serve.models.host_logits,
            this tree); per-head: one copy per head, as before (the function patched to do that)

Each configuration runs --batches requests of 16 SST-2 test sentences (one batch of 16 rows each), after a
warm-up, interleaved over --rounds rounds. Reported: ms per batch (median, p90), the batcher thread's CPU ms
per batch, and the busy thread's units of work per second (what the event loop got done meanwhile).

  python bench/gpu_batch_gil.py --models .gpu/serve/models --device cuda --out $OUT/gpu_batch_gil.json
  PYTHONPATH=/tmp/site-rounded python bench/gpu_batch_gil.py --models .gpu/serve/models --device cpu --batches 20
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class Busy:
    """A thread doing an event loop's kind of per-request work for `duty` of the time, sleeping the rest."""

    def __init__(self, tok, texts: list[str], duty: float):
        self.tok, self.texts, self.duty = tok, texts, duty
        self.units, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def unit(self, i: int) -> None:
        text = self.texts[i % len(self.texts)]
        body = json.loads(json.dumps({"texts": [text], "tasks": None}))
        self.tok(body["texts"], truncation=True, max_length=128)
        answer = {f"task{k}": {"label": "positive", "scores": {"negative": 0.25, "positive": 0.75}} for k in range(8)}
        json.dumps({"results": [{"text": text, "tasks": answer}]})

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.unit(i)
            i += 1
            self.units += 1
            if self.duty < 1:
                time.sleep((time.perf_counter() - t0) * (1 - self.duty) / self.duty)

    def __enter__(self) -> "Busy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def batcher_cpu(engine) -> float:
    """Seconds of CPU the engine's batcher threads (the worker and, with --pipeline on, the finisher) have
    used (Linux: /proc's per-thread stat)."""
    import os

    total = 0
    for t in (engine.batcher._thread, engine.batcher._finisher):
        fields = Path(f"/proc/{os.getpid()}/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def per_head_logits(outs: list) -> list:
    """The patch for host_logits that restores one device→host copy per head (the code before it)."""
    return [o.logits.float().cpu() for o in outs]


def run_config(engine, texts: list[str], batches: int, busy: Busy | None, switch_ms: float) -> dict:
    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_ms / 1000)
    try:
        times = []
        c0, u0, w0 = batcher_cpu(engine), busy.units if busy else 0, time.perf_counter()
        for _ in range(batches):
            t0 = time.perf_counter()
            engine.classify(texts)
            times.append(time.perf_counter() - t0)
        wall = time.perf_counter() - w0
        c1, u1 = batcher_cpu(engine), busy.units if busy else 0
    finally:
        sys.setswitchinterval(old)
    times.sort()
    return {"ms_median": 1000 * statistics.median(times), "ms_p90": 1000 * times[int(0.9 * (len(times) - 1))],
            "batcher_cpu_ms": 1000 * (c1 - c0) / batches, "busy_units_per_s": (u1 - u0) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=None, help="serve_load's models folder (its heads/ inside)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--switch", default="5,1,0.2", help="switch intervals (ms) tried beside the busy thread")
    ap.add_argument("--duty", type=float, default=0.6, help="the busy thread's share of time at work")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import torch
    import copy

    import serve_load as sl
    from frozentune.serve import models
    from frozentune.serve.engine import Engine

    torch.set_num_threads(1)
    heads = (a.models or sl.MODELS) / "heads"
    folders = {"1": [heads / sl.HEADS[0][0]], "8": [heads / n for n, _, _ in sl.HEADS]}
    short = sl.short_texts()
    texts = short[:16]
    engines = {k: Engine.load(v, a.device, log=lambda _: None) for k, v in folders.items()}
    tok = copy.deepcopy(engines["1"].groups[0].backbone.tok)  # the busy thread's own tokenizer
    one_copy, per_head = models.host_logits, per_head_logits
    configs = [(h, "quiet", 5.0, ans) for h in folders for ans in ("one-copy", "per-head")]
    configs += [(h, "busy", float(s), ans) for h in folders for s in a.switch.split(",") for ans in ("one-copy", "per-head")]
    for e in engines.values():
        for _ in range(30):
            e.classify(texts)
    results: dict[str, list[dict]] = {}
    for r in range(a.rounds):
        for h, load, switch, ans in configs:
            models.host_logits = one_copy if ans == "one-copy" else per_head
            try:
                if load == "busy":
                    with Busy(tok, short[16:], a.duty) as busy:
                        res = run_config(engines[h], texts, a.batches, busy, switch)
                else:
                    res = run_config(engines[h], texts, a.batches, None, switch)
            finally:
                models.host_logits = one_copy
            name = f"{h} heads, {load}, switch {switch:g} ms, {ans}"
            results.setdefault(name, []).append(res)
            print(f"round {r + 1} {name:45s} median {res['ms_median']:7.2f} ms  p90 {res['ms_p90']:7.2f} ms  "
                  f"batcher CPU {res['batcher_cpu_ms']:6.2f} ms/batch  busy {res['busy_units_per_s']:7.0f} units/s",
                  flush=True)
    for e in engines.values():
        e.close()
    summary = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}
    print("\nmedians over rounds:")
    for name, s in summary.items():
        print(f"{name:45s} {s['ms_median']:7.2f} ms/batch  batcher CPU {s['batcher_cpu_ms']:6.2f}  busy {s['busy_units_per_s']:7.0f}/s")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"device": a.device, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available()
                                     else None, "batches": a.batches, "rounds": a.rounds, "duty": a.duty,
                                     "torch": torch.__version__, "python": sys.version.split()[0],
                                     "rounds_results": results, "medians": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
