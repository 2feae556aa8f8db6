"""Mixed-prefix batching (Li & Liang §8.2) on SmolLM2-135M: generation throughput of one batch of
16 requests, each with its own prefix, against the same batch with one shared prefix and against
the 16 requests run one after another (each with its prefix, batch of 1). Measured in one process,
the three modes interleaved, median of the repeats; every row decodes exactly the same number of
new tokens (min_new_tokens = max_new_tokens), so throughput does not depend on where rows stop.

The 16 prefixes are the LM's own keys/values on 16 different short phrases (init=words), so they
have the scale of real activations. Two settings: all 10 positions long, and lengths 4…19 (the
mixed batch pads every prefix to 19 with masked slots; its one-prefix baseline uses the 19-long one,
so both attend to the same number of slots and the ratio measures the mixing alone).

  python bench/prefix_mixed.py                 # writes bench/results/prefix-mixed.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PHRASES = ["table-to-text:", "summarize the following", "describe the restaurant", "write a review",
           "translate to French", "answer the question", "restaurant description:", "data to text",
           "generate a sentence", "write one sentence about", "the following table", "a short description",
           "rewrite politely", "list the facts", "tell me about", "describe in English"]


def prefixes(lm, tok, lengths: list[int]) -> list[torch.Tensor]:
    from frozentune.generation.prefix import activations, phrase_ids

    return [activations(lm, phrase_ids(tok, phrase, n)) for phrase, n in zip(PHRASES, lengths)]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    from frozentune.api import peak_rss_mb
    from frozentune.backbone import load_causal_lm
    from frozentune.data import load_generation
    from frozentune.generation.prefix import PrefixBatch, encode_sources, eos_id_of, generate, pad_id_of

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    lm, tok = load_causal_lm("smollm2-135m")
    k = a.requests
    sources = encode_sources(tok, [ex.source for ex in load_generation("e2e", "test")[:k]])
    pad, eos = pad_id_of(lm, tok), eos_id_of(lm, tok)
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens)

    def run(batch: PrefixBatch, prompts) -> list[list[int]]:
        return generate(lm, batch, prompts, pad, eos, **kw)

    out = {"command": "python bench/prefix_mixed.py " + " ".join(sys.argv[1:]), "requests": k,
           "new_tokens": a.new_tokens, "repeats": a.repeats, "threads": torch.get_num_threads(),
           "date": time.strftime("%Y-%m-%d %H:%M"), "settings": []}
    for name, lengths in (("all prefixes 10 positions", [10] * k), ("prefix lengths 4…19", [4 + i for i in range(k)])):
        ps = prefixes(lm, tok, lengths)
        single, mixed, sequential = "one prefix, one batch", f"{k} prefixes, one batch", f"{k} prefixes one after another"
        longest = max(ps, key=lambda p: p.shape[3])  # the one-prefix batch attends to as many slots as the mixed one
        modes = {single: lambda: run(PrefixBatch.single(longest, k), sources),
                 mixed: lambda: run(PrefixBatch.mixed(ps), sources),
                 sequential: lambda: [run(PrefixBatch.single(p, 1), [s])[0] for p, s in zip(ps, sources)]}
        run(PrefixBatch.mixed(ps[:2]), sources[:2])  # warm-up
        times: dict[str, list[float]] = {m: [] for m in modes}
        outputs = {}
        for _ in range(a.repeats):
            for m, fn in modes.items():
                secs, outputs[m] = timed(fn)
                times[m].append(secs)
        med = {m: statistics.median(v) for m, v in times.items()}
        tps = {m: k * a.new_tokens / med[m] for m in modes}
        row = {"name": name, "lengths": lengths, "seconds": times, "median_seconds": med, "tokens_per_s": tps,
               "mixed_vs_single": tps[mixed] / tps[single], "mixed_vs_sequential": tps[mixed] / tps[sequential],
               "mixed_rows_equal_sequential": outputs[mixed] == outputs[sequential]}
        out["settings"].append(row)
        print(f"{name}: " + ", ".join(f"{m} {v:,.1f} tok/s" for m, v in tps.items())
              + f"; mixed/single {row['mixed_vs_single']:.2f}x, mixed/sequential {row['mixed_vs_sequential']:.2f}x, "
              f"rows equal {row['mixed_rows_equal_sequential']}", flush=True)
    out["peak_rss_mb"] = peak_rss_mb()
    from run import machine
    out["machine"] = machine(torch.get_num_threads())
    (HERE / "results" / "prefix-mixed.json").write_text(json.dumps(out, indent=2))


def report(r: dict) -> str:
    rows = [f"`{r['command']}` ({r['date']}, {r['machine']}; {r['requests']} requests × {r['new_tokens']} new tokens "
            f"each (greedy, fixed length), median of {r['repeats']} interleaved repeats)", "",
            f"| prefixes | one prefix, batch of {r['requests']} tok/s | {r['requests']} prefixes, one batch tok/s | one after another tok/s "
            "| mixed / one prefix | mixed / one after another | mixed rows = each alone |",
            "|---|---:|---:|---:|---:|---:|---|"]
    for s in r["settings"]:
        t = list(s["tokens_per_s"].values())
        rows.append(f"| {s['name']} | {t[0]:,.1f} | {t[1]:,.1f} | {t[2]:,.1f} | {s['mixed_vs_single']:.2f}x | "
                    f"{s['mixed_vs_sequential']:.2f}x | {'yes' if s['mixed_rows_equal_sequential'] else 'NO'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
