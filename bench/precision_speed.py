"""Backbone-pass speed and state error of each --precision on the CPU (issue 16).

  python bench/precision_speed.py --threads 1 --out bench/results/precision_speed.json
  ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
      python bench/precision_speed.py --threads 1 --small fp16,bf16 --out bench/results/precision_speed-avx2.json
  python bench/precision_speed.py --threads 1 --repeats 3 --imdb 250 --small fp16,bf16,int8 \
      --out bench/results/precision_speed-avx2-native.json   # on a CPU with AVX2 only (int8 is slow there too)
  python bench/precision_speed.py --report bench/results/precision_speed.json   # only print the table

MiniLM (`minilm`), the frozen pass as extraction runs it: frozentune.extract.precision.prepare, then
iter_states over length-sorted batches of at most 8,192 padded tokens, default layer. Two slices:
(a) the first --sst2 SST-2 train texts (max_length 128) and (b) the first --imdb IMDB train reviews
at max_length 256 (the issue asks for 2,000 reviews; the default is fewer, so that a 1-thread run of
all precisions stays within ~10 minutes on a shared machine: the JSON records how many).

Precisions listed in --small (fp16 by default: no fp16 matrix units on x86 CPUs, ~5-7x slower than
fp32) run on the first --small-fraction of each slice instead, and are compared with an fp32 pass
over that same smaller slice. Everything runs interleaved in rounds (fp32, bf16, fp16, int8, fp32
small, ...), so the load of a shared machine touches all alike; reported: median tokens/s
(real, not padding, tokens) per precision and the median over rounds of the ratio to fp32 of the
same round and slice. Before timing: the states' error against fp32 on the first 200 SST-2 test
sentences, per token ‖s − s32‖ / ‖s32‖, mean and max, at layer 4 and at the last layer.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pass_seconds(runner, tok, tokens) -> float:
    from frozentune.backbone import LayerSpec, iter_states

    t0 = time.perf_counter()
    for _ in iter_states(runner, tok, tokens, LayerSpec(), max_tokens=8192):
        pass
    return time.perf_counter() - t0


def token_states(runner, tok, tokens, layer: int):
    import torch
    from frozentune.backbone import LayerSpec, iter_states

    out = {}
    for idx, s, mask in iter_states(runner, tok, tokens, LayerSpec((layer,)), max_tokens=8192):
        for r, i in enumerate(idx):
            out[int(i)] = s[r, : int(mask[r].sum())].float()
    return torch.cat([out[i] for i in range(len(tokens.ids))])


def state_errors(runners: dict, tok, tokens) -> dict:
    errors = {}
    for layer in (4, -1):
        ref = token_states(runners["fp32"], tok, tokens, layer)
        for p, r in runners.items():
            if p == "fp32":
                continue
            rel = (token_states(r, tok, tokens, layer) - ref).norm(dim=-1) / ref.norm(dim=-1)
            errors.setdefault(p, {})[f"layer{layer}"] = {"mean": float(rel.mean()), "max": float(rel.max())}
    return errors


def head(tokens, fraction: float):
    from frozentune.backbone import Tokenized

    n = max(1, int(len(tokens.ids) * fraction))
    return Tokenized(tokens.ids[:n], tokens.max_length)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "precision_speed.json")
    ap.add_argument("--precisions", default="fp32,bf16,fp16,int8")
    ap.add_argument("--sst2", type=int, default=4000, help="first N SST-2 train texts")
    ap.add_argument("--imdb", type=int, default=300, help="first N IMDB train reviews (max_length 256)")
    ap.add_argument("--small", default="fp16", help="precisions timed on the smaller slices")
    ap.add_argument("--small-fraction", type=float, default=0.125)
    ap.add_argument("--errors-n", type=int, default=200, help="SST-2 test sentences for the state errors")
    ap.add_argument("--report", type=Path, help="print the table of this JSON and exit")
    a = ap.parse_args()
    if a.report:
        print(table(json.loads(a.report.read_text())))
        return

    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch

    torch.set_num_threads(a.threads)
    from frozentune.backbone import Backbone
    from frozentune.data import data_root, read_split
    from frozentune.extract.device import cpu_features, cpu_summary
    from frozentune.extract.precision import default_precision, int8_weight_levels, prepare

    precisions = a.precisions.split(",")
    small = set(a.small.split(",")) & set(precisions) if a.small else set()
    root = data_root()
    sst2 = Backbone.load("minilm", max_length=128)
    imdb = Backbone.load("minilm", max_length=256)
    texts = {"sst2": list(read_split(root / "sst2" / "train.jsonl").texts)[: a.sst2],
             "imdb": list(read_split(root / "imdb" / "train.jsonl").texts)[: a.imdb]}
    tokens = {"sst2": sst2.tokenize(texts["sst2"]), "imdb": imdb.tokenize(texts["imdb"])}
    tokens_small = {k: head(v, a.small_fraction) for k, v in tokens.items()}
    cpu = torch.device("cpu")

    runners, prep_s = {}, {}
    for p in precisions:
        t0 = time.perf_counter()
        runners[p] = prepare(sst2.model, p, cpu)
        prep_s[p] = time.perf_counter() - t0
    test = list(read_split(root / "sst2" / "test.jsonl").texts)[: a.errors_n]
    errors = state_errors(runners, sst2.tok, sst2.tokenize(test)) if "fp32" in runners else {}
    print(json.dumps(errors, indent=1), flush=True)

    # warm-up: one pass over the smaller slice of each (first calls allocate, pack weights, probe kernels)
    for p, r in runners.items():
        for d in tokens:
            pass_seconds(r, sst2.tok, tokens_small[d])

    def n_tokens(t) -> int:
        return int(t.lengths.sum())

    meta = {d: {"texts": len(tokens[d].ids), "tokens": n_tokens(tokens[d]), "max_length": tokens[d].max_length,
                "small_texts": len(tokens_small[d].ids), "small_tokens": n_tokens(tokens_small[d])} for d in tokens}
    rounds = []
    for r in range(a.repeats):
        row = {}
        for d in tokens:
            tok = sst2.tok
            secs = {}
            for p in precisions:
                secs[p] = pass_seconds(runners[p], tok, tokens_small[d] if p in small else tokens[d])
            if small and "fp32" in runners:
                secs["fp32-small"] = pass_seconds(runners["fp32"], tok, tokens_small[d])
            row[d] = {}
            for p, s in secs.items():
                t = tokens_small[d] if (p in small or p == "fp32-small") else tokens[d]
                base = secs.get("fp32-small" if (p in small or p == "fp32-small") else "fp32")
                row[d][p] = {"seconds": s, "tokens_per_s": n_tokens(t) / s,
                             "ratio_to_fp32": (base / s) if base else None}
            print(f"round {r}: {d} " + "  ".join(f"{p} {v['tokens_per_s']:.0f} tok/s (x{v['ratio_to_fp32']:.2f})"
                                                   for p, v in row[d].items()), flush=True)
        rounds.append(row)

    summary = {d: {p: {"tokens_per_s": statistics.median(rw[d][p]["tokens_per_s"] for rw in rounds),
                       "ratio_to_fp32": statistics.median(rw[d][p]["ratio_to_fp32"] for rw in rounds),
                       "slice": "small" if (p in small or p == "fp32-small") else "full"}
                   for p in rounds[0][d]} for d in tokens}
    chosen, why = default_precision(cpu)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]),
           "env": {k: os.environ.get(k) for k in ENV}, "threads": a.threads, "torch": torch.__version__,
           "machine": platform.processor() or platform.machine(), "cpu": cpu_features(), "cpu_summary": cpu_summary(),
           "int8_weight_levels": int8_weight_levels(), "default_precision": [chosen, why],
           "data": meta, "small": sorted(small), "small_fraction": a.small_fraction,
           "prepare_seconds": prep_s, "state_errors": {"texts": len(test), "per_token_relative_l2": errors},
           "summary": summary, "rounds": rounds}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(table(out))


def table(res: dict) -> str:
    lines = [f"{res['cpu_summary']}; torch {res['torch']}; env {', '.join(f'{k}={v}' for k, v in res['env'].items() if v)}",
             "| precision | SST-2 tok/s | × fp32 | IMDB-256 tok/s | × fp32 | err L4 mean/max | err last mean/max |",
             "|---|---|---|---|---|---|---|"]
    errs = res["state_errors"]["per_token_relative_l2"]
    for p in res["summary"]["sst2"]:
        cells = [p]
        for d in ("sst2", "imdb"):
            s = res["summary"][d][p]
            cells += [f"{s['tokens_per_s']:.0f}" + (" (small)" if s["slice"] == "small" else ""), f"{s['ratio_to_fp32']:.2f}"]
        e = errs.get(p)
        cells += ([f"{e['layer4']['mean']:.2%} / {e['layer4']['max']:.2%}", f"{e['layer-1']['mean']:.2%} / {e['layer-1']['max']:.2%}"]
                  if e else ["0", "0"] if p.startswith("fp32") else ["", ""])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
