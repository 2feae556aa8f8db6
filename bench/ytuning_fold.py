"""What folding the cross-attention's keys and values into the label side saves Y-Tuning at
inference: its forward without autograd (folded_cross_attention: the tokens' keys and values are
never formed) against the same forward along the training path (nn.MultiheadAttention over the
projected tokens; run under torch.enable_grad() with no parameter requiring a gradient, so no graph
is recorded), side by side in one process on the same batches, torch pinned to 1 thread.

Batches as bench/span_packing.py's: 16 texts drawn with seed 0 from SST-2 test (short) or an IMDB
test slice (long, cut at 128 tokens), MiniLM's tokenizer, padded to the longest row rounded up to 8.
Random states (speed does not depend on their values); the default head (2 blocks, D 128, 4 heads,
k 1) over D = 384, with 2 classes (SST-2) and 6 (TREC). Each mode runs the batches --repeats times,
interleaved with the other; best of the repeats.

  OMP_NUM_THREADS=1 python bench/ytuning_fold.py            # writes bench/results/ytuning_fold.json
"""
from __future__ import annotations

import torch


def main() -> None:
    from serve_load import long_texts, short_texts
    from span_packing import batches, parse_args, timed, write_rows

    a = parse_args(__doc__, "ytuning_fold.json")
    from frozentune.registry import create_method

    rows = []
    for kind, texts in (("short (SST-2 test)", short_texts()), ("long (IMDB test)", long_texts())):
        masks = batches(texts, a.rows, a.count, 128)
        feats = [(torch.randn(*m.shape, 384) * m[..., None], m) for m in masks]
        for classes in (2, 6):
            torch.manual_seed(0)
            head = create_method("ytuning", 384, classes, {})[0].eval()
            best = {"one-shot": float("inf"), "infer": float("inf")}
            for _ in range(a.repeats):
                for mode in best:
                    best[mode] = min(best[mode], timed(head, feats, mode))
            row = {"texts": kind, "classes": classes, "batches": a.count, "rows": a.rows,
                   "mean_padded_tokens": sum(m.shape[1] for m in masks) / len(masks),
                   "training_path_ms": 1000 * best["one-shot"] / a.count, "folded_ms": 1000 * best["infer"] / a.count,
                   "speedup": best["one-shot"] / best["infer"]}
            rows.append(row)
            print(f"{kind:20s} {classes} classes T≈{row['mean_padded_tokens']:.0f}: training path "
                  f"{row['training_path_ms']:.2f} ms, folded {row['folded_ms']:.2f} ms, {row['speedup']:.2f}×", flush=True)
    write_rows(a, "ytuning_fold.py", rows)


if __name__ == "__main__":
    main()
