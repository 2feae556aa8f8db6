"""Classify latency while decodes run: the batcher's lanes (generation on a worker of its own, the
layout since 2026-11-27) against one worker for every group (the layout before), side by side in one
process, on one Engine's loaded models.

Models (made once into bench/runs/serve-models, git-ignored, as bench/serve_load.py makes them): the
probe head at layer 4 of MiniLM (SST-2, 1,500 training sentences) and 4 untrained prefixes on
SmolLM2-135M (its keys/values on 4 phrases, init=words). For each layout:
  idle   --requests classify requests one at a time (one SST-2 test sentence each), nothing else running;
  busy   the same requests while --decoders threads each send generate requests back to back
         (--beams beams, exactly --new-tokens new tokens: min_new_tokens = max_new_tokens).
Reported per layout: classify latency p50 / p95 / max, idle and busy (and, in the JSON, the decode requests
answered from the decoders' start to the last classify answer: a window too short with lanes to time decoding).

  OMP_NUM_THREADS=1 python bench/serve_lanes.py --threads 1
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

import serve_load  # noqa: E402  (the models and helpers of the serve benchmark)


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": 1000 * statistics.median(xs), "p95_ms": 1000 * xs[min(len(xs) - 1, int(0.95 * len(xs)))],
            "max_ms": 1000 * xs[-1], "n": len(xs)}


def classify_latencies(engine, texts: list[str]) -> list[float]:
    out = []
    for t in texts:
        t0 = time.perf_counter()
        engine.classify([t])
        out.append(time.perf_counter() - t0)
    return out


def run_layout(tasks, lanes: bool, texts: list[str], prefixes: list[str], a) -> dict:
    from frozentune.serve import Engine, ServeOptions
    from frozentune.serve.models import LMGroup

    LMGroup.lane = "generate" if lanes else ""  # "": the classify worker's lane, one worker for every group
    engine = Engine(tasks, ServeOptions())
    try:
        classify_latencies(engine, texts[:5])  # warm the shapes
        idle = classify_latencies(engine, texts)
        stop, tokens, answered = threading.Event(), [0], [0]
        source = "name[Aromi], eatType[coffee shop], area[city centre]"

        def decoder(prefix: str) -> None:
            while not stop.is_set():
                r = engine.generate(prefix, [source], num_beams=a.beams, max_new_tokens=a.new_tokens,
                                    min_new_tokens=a.new_tokens)
                tokens[0] += sum(o["tokens"] for o in r["outputs"])
                answered[0] += 1

        threads = [threading.Thread(target=decoder, args=(p,), daemon=True) for p in prefixes[:a.decoders]]
        for t in threads:
            t.start()
        time.sleep(a.settle)  # the first decode batch is under way
        t0 = time.perf_counter()
        busy = classify_latencies(engine, texts)
        seconds = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join(600)
        return {"layout": "lanes" if lanes else "one worker", "idle": percentiles(idle), "busy": percentiles(busy),
                "busy_seconds": seconds, "decode_requests_answered": answered[0], "decode_tokens": tokens[0]}
    finally:
        engine.close()
        LMGroup.lane = "generate"


def train_probe(folder: Path) -> dict:
    """serve_load's probe-l4 head (trained when missing, with serve_load's command) and its test accuracy."""
    import subprocess

    out = folder / "probe-l4"
    args = ["train", "--method", "probe", "--layer", "4", *serve_load.TRAIN_ARGS, "--quiet", "--output", str(out)]
    if not (out / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        serve_load.log(f"training probe-l4: frozentune {' '.join(args)}")
        subprocess.run([*serve_load.ft(), *args, "--overwrite"], check=True, stdin=subprocess.DEVNULL)
    res = json.loads((out / "result.json").read_text())
    return {"command": "frozentune " + " ".join(args), "test_accuracy": res["metrics"]["accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--decoders", type=int, default=4)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between starting the decoders and measuring")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "serve_lanes.json")
    a = ap.parse_args()

    import torch

    from frozentune.data import read_split, resolve
    from frozentune.serve.models import find_models, load_tasks

    torch.set_num_threads(a.threads)
    heads = train_probe(serve_load.MODELS / "heads")
    gens = serve_load.make_prefixes(serve_load.MODELS / "prefixes", a.new_tokens)
    folders = [serve_load.MODELS / "heads" / "probe-l4"] + [serve_load.MODELS / "prefixes" / g
                                                          for g in gens["folders"][:a.decoders]]
    tasks = load_tasks(find_models(folders), "cpu", None, log=lambda s: None)
    texts = read_split(resolve("sst2")[1]["test"]).texts[:a.requests]
    prefixes = gens["folders"][:a.decoders]
    rows = [run_layout(tasks, lanes, texts, prefixes, a) for lanes in (False, True)]
    result = {"command": "python bench/serve_lanes.py " + " ".join(sys.argv[1:]), "cpu": serve_load.cpu_model(),
              "torch_threads": torch.get_num_threads(), "decoders": a.decoders, "beams": a.beams,
              "new_tokens": a.new_tokens, "requests": a.requests, "probe": heads,
              "rows": rows}
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=2))
    print(f"{result['command']} — {result['cpu']}, {result['torch_threads']} torch thread(s); {a.decoders} decoders "
          f"× {a.beams} beams × {a.new_tokens} new tokens; {a.requests} classify requests one at a time")
    print("| layout | idle p50 / p95 ms | busy p50 / p95 / max ms | busy p50 ÷ idle p50 |")
    print("|---|---:|---:|---:|")
    for r in rows:
        i, b = r["idle"], r["busy"]
        print(f"| {r['layout']} | {i['p50_ms']:.1f} / {i['p95_ms']:.1f} | {b['p50_ms']:.1f} / {b['p95_ms']:.1f} / "
              f"{b['max_ms']:.0f} | {b['p50_ms'] / i['p50_ms']:.1f} |")


if __name__ == "__main__":
    main()
