"""Decoding a trained prefix in bf16 against fp32 (`--precision`, generation/precision.py), on this
CPU, in one process:

  quality     BLEU / chrF / ROUGE-L of greedy decoding of every E2E test MR (630), decoded and scored
              by the code `frozentune eval` runs, in each precision; how many outputs are identical between the two.
  invariance  the first --alone test sources decoded one at a time against the same sources in the
              batched decode above (batches of 32, sorted by length): how many outputs differ, per
              precision. fp32 decoding is expected to give the same tokens; bf16 need not.
  speed       tokens/s of a batch of 1 and of 8 (E2E test MRs, exactly --new-tokens each: min = max),
              each precision, the four interleaved, median of --repeats; the batch-of-8 / batch-of-1
              ratio is what a server gains from batching requests.

The model: a prefix trained as bench/run.py's low-data E2E run trains it (100 pairs, seed 0):

  frozentune train --method prefix --init words --data e2e --num-beams 1 --max-train 100 \\
      --max-validation 100 --epochs 8 --seed 0 --output bench/runs/e2e-prefix
  OMP_NUM_THREADS=1 python bench/decode_precision.py --model bench/runs/e2e-prefix --threads 1
      → bench/results/decode_precision.json and .md
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
PRECISIONS = ("fp32", "bf16")


def speed(tuners: dict, sources: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """{precision: {batch: tokens/s}}, median over repeats; every (precision, batch) once per repeat."""
    got: dict = {p: {1: [], 8: []} for p in tuners}
    for _ in range(repeats):
        for p, tuner in tuners.items():
            for b in (1, 8):
                t0 = time.perf_counter()
                rows = tuner.generate(sources[:b], max_new_tokens=new_tokens, num_beams=1, min_new_tokens=new_tokens)
                dt = time.perf_counter() - t0
                got[p][b].append(sum(len(r) for r in rows) / dt)
    return {p: {str(b): round(statistics.median(v), 1) for b, v in bs.items()} for p, bs in got.items()}


def main() -> int:
    from frozentune.extract.device import cpu_features
    from frozentune.generation.run import decode, load_generation_splits, load_tuner, scores

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a trained E2E prefix folder (see the docstring)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--alone", type=int, default=64, help="test sources decoded one at a time (invariance)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", type=Path, default=HERE / "results" / "decode_precision.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    command = "python bench/decode_precision.py " + " ".join(sys.argv[1:])
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    config = json.loads((a.model / "config.json").read_text())
    test = load_generation_splits("e2e", config.get("train", {}).get("seed", 0), config["splits"].get("max_train"),
                                  config["splits"].get("max_validation", 200)).test  # as `frozentune eval` draws it
    srcs = [ex.source for ex in test]
    d = config["decoding"]
    beams, new = d["num_beams"], d["max_new_tokens"]
    tuners, quality, outputs, seconds = {}, {}, {}, {}
    for p in PRECISIONS:
        tuners[p], tok, _ = load_tuner(a.model, "cpu", p, log)
        t0 = time.perf_counter()
        outputs[p] = decode(tuners[p], tok, srcs, beams, new, d["batch_size"], log)  # evaluate_generation's decode
        seconds[p] = round(time.perf_counter() - t0, 1)
        quality[p] = {k: round(v, 2) for k, v in scores(outputs[p], [ex.refs for ex in test]).items()}
        log(f"{p}: {quality[p]} in {seconds[p]} s")
    same = sum(x == y for x, y in zip(outputs["fp32"], outputs["bf16"]))
    invariance = {}
    for p, tuner in tuners.items():
        alone = [decode(tuner, tok, [s], beams, new, 1)[0] for s in srcs[:a.alone]]
        invariance[p] = sum(x != y for x, y in zip(alone, outputs[p][:a.alone]))
        log(f"{p}: {invariance[p]} of {a.alone} differ alone vs batched")
    ids = tuners["fp32"].encode_sources(srcs[:8])
    tps = speed(tuners, ids, a.new_tokens, a.repeats)
    log(f"speed: {tps}")
    f = cpu_features()
    result = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "threads": a.threads,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
                         f"cpu flags: {', '.join(k for k in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16') if f.get(k))}",
              "model": str(a.model), "test_sources": len(srcs), "decoding": {"num_beams": beams, "max_new_tokens": new},
              "quality": quality, "decode_seconds": seconds, "identical_outputs": same,
              "alone_vs_batched": {"sources": a.alone, "differing": invariance},
              "tokens_per_s": tps, "new_tokens": a.new_tokens, "repeats": a.repeats}
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=2) + "\n")
    a.output.with_suffix(".md").write_text(report(result))
    print(report(result))
    return 0


def report(r: dict) -> str:
    q, t = r["quality"], r["tokens_per_s"]
    lines = [f"`{r['command']}` ({r['date']}; {r['machine']}). Model: {r['model']}; {r['test_sources']} E2E test MRs, "
             f"greedy, max_new_tokens {r['decoding']['max_new_tokens']}.", "",
             "| precision | BLEU | chrF | ROUGE-L | decode s (630 MRs, batches of 32) | tok/s batch 1 | tok/s batch 8 | "
             "batch 8 / batch 1 | outputs differing alone vs batched |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in q:
        lines.append(f"| {p} | {q[p].get('bleu', float('nan')):.2f} | {q[p].get('chrf', float('nan')):.2f} | "
                     f"{q[p].get('rouge_l', float('nan')):.2f} | {r['decode_seconds'][p]} | {t[p]['1']} | {t[p]['8']} | "
                     f"{t[p]['8'] / t[p]['1']:.2f}x | {r['alone_vs_batched']['differing'][p]} of "
                     f"{r['alone_vs_batched']['sources']} |")
    lines += ["", f"- Outputs identical in fp32 and bf16: {r['identical_outputs']} of {r['test_sources']}.",
              f"- bf16 / fp32 tokens/s, same run: batch 1 {t['bf16']['1'] / t['fp32']['1']:.2f}x, batch 8 "
              f"{t['bf16']['8'] / t['fp32']['8']:.2f}x (exactly {r['new_tokens']} new tokens a row, median of "
              f"{r['repeats']}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
