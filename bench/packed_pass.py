"""The packed frozen pass (extract/packed.py) against the model's own padded forward, on the
batches a server sees: texts in arrival order, padded to the longest row rounded up to 8.

Batches as bench/span_packing.py's: --rows texts drawn with seed 0 from SST-2 test (short) or an
IMDB test slice (long, cut at 128 tokens), MiniLM's tokenizer, --count batches per kind. For each
precision the backbone is prepared as the server prepares it (Backbone.runner), and the same batches
run through `Backbone.hidden_states` with `pack` on and off, interleaved, --repeats times; the best
of the repeats. Each row also says what share of the padded slots real tokens fill, and the largest
per-token relative difference of the last layer's states between the two (at real tokens).

  OMP_NUM_THREADS=1 python bench/packed_pass.py            # writes bench/results/packed_pass.json
"""
from __future__ import annotations

import random
import time


def run_all(bb, inputs: list) -> float:
    t = time.perf_counter()
    for ids, mask, types in inputs:
        bb.hidden_states(ids, mask, types)
    return time.perf_counter() - t


def largest_difference(bb, inputs: list) -> float:
    """max over real tokens of |packed − padded| / |padded| (L2 per token), last layer."""
    worst = 0.0
    for ids, mask, types in inputs:
        bb.pack = True
        a = bb.hidden_states(ids, mask, types)[-1].float()
        bb.pack = False
        b = bb.hidden_states(ids, mask, types)[-1].float()
        keep = mask.bool()
        worst = max(worst, float(((a[keep] - b[keep]).norm(dim=-1) / b[keep].norm(dim=-1)).max()))
    bb.pack = True
    return worst


def main() -> None:
    from serve_load import long_texts, short_texts
    from span_packing import parse_args, write_rows

    a = parse_args(__doc__, "packed_pass.json")
    from frozentune.backbone import Backbone

    rows = []
    for precision in ("fp32", "bf16", "int8"):
        bb = Backbone.load("minilm", max_length=128, precision=precision)
        assert bb.packs, bb.pass_layout
        for kind, texts in (("short (SST-2 test)", short_texts()), ("long (IMDB test)", long_texts())):
            rng = random.Random(0)
            inputs, filled = [], []
            for _ in range(a.count):
                tokens = bb.tokenize(rng.sample(texts, a.rows))
                T = min(-(-int(tokens.lengths.max()) // 8) * 8, 128)
                ids, mask, types = tokens.padded(list(range(a.rows)), bb.pad_id(), T)
                inputs.append((ids, mask, types))
                filled.append(float(mask.float().mean()))
            best = {True: float("inf"), False: float("inf")}
            run_all(bb, inputs[:2])  # warm-up: kernels' first-shape costs
            for _ in range(a.repeats):
                for pack in (False, True):
                    bb.pack = pack
                    best[pack] = min(best[pack], run_all(bb, inputs))
            bb.pack = True
            row = {"precision": precision, "texts": kind, "batches": a.count, "rows": a.rows,
                   "real_token_share": sum(filled) / len(filled),
                   "padded_ms": 1000 * best[False] / a.count, "packed_ms": 1000 * best[True] / a.count,
                   "speedup": best[False] / best[True], "max_rel_difference": largest_difference(bb, inputs)}
            rows.append(row)
            print(f"{precision:5s} {kind:20s} real tokens {row['real_token_share']:.0%}: padded {row['padded_ms']:.1f} ms, "
                  f"packed {row['packed_ms']:.1f} ms a batch, {row['speedup']:.2f}×; "
                  f"max rel. difference {row['max_rel_difference']:.1e}", flush=True)
    write_rows(a, "packed_pass.py", rows)


if __name__ == "__main__":
    main()
