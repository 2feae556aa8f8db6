"""What computing only the valid spans saves the self-explaining head: its forward (and, for
training, forward + backward) with every (i, w) slot computed (`every_slot`, what an exporter
traces, and what every forward did before) against the eager default (the valid spans only, unless
more than PACK_BELOW of the slots are valid, when it computes every slot too), side by side in one
process on the same batches, torch pinned to 1 thread.

Forward without autograd (inference: predict, explain, serve) has a third mode, the default there
since 2026-11-25: the valid spans computed CHUNK_SPANS at a time (span_chunks; since be94d22 in one reused buffer and softmaxed online, pool_streaming), at
any share of valid spans. Its row compares it with both: every slot, and "one shot", the eager
default before it (the autograd path with no parameter requiring a gradient: the same code, run
under torch.enable_grad(), so it takes the one-shot branch and PACK_BELOW's choice without
recording a graph).

Batches: 16 texts drawn with seed 0 from SST-2 test (short) or an IMDB test slice (long, cut at 128
tokens as serve_load.py's), tokenised by MiniLM's tokenizer and padded to the longest row rounded
up to 8, as the server pads them. The states are random (speed does not depend on their values),
the head the default's shape (width 5, D′ 256, D 384, 2 classes). Each mode runs the batches
--repeats times, interleaved with the other; best of the repeats.

  OMP_NUM_THREADS=1 python bench/span_packing.py            # writes bench/results/span_packing.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def batches(texts: list[str], rows: int, count: int, max_length: int, seed: int = 0) -> list[torch.Tensor]:
    """`count` (B, T) bool masks of `rows` random texts, padded as the server pads (multiple of 8)."""
    from frozentune.backbone import load_encoder

    tok = load_encoder("minilm")[1]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        lengths = [len(tok(t, truncation=True, max_length=max_length)["input_ids"]) for t in rng.sample(texts, rows)]
        T = min(-(-max(lengths) // 8) * 8, max_length)
        out.append(torch.arange(T)[None, :] < torch.tensor(lengths)[:, None])
    return out


@contextlib.contextmanager
def training_path(head):
    """Inside: the head's forward takes its autograd branches (the path training runs, and what every
    forward ran before the heads got inference paths) without recording a graph: it runs under
    enable_grad with no parameter requiring a gradient, also inside no_grad. Restored on exit."""
    flags = [p.requires_grad for p in head.parameters()]
    head.requires_grad_(False)

    def forward(f, run=head.forward):
        with torch.enable_grad():
            return run(f)
    head.forward = forward  # an instance attribute: nn.Module.__call__ calls it
    try:
        yield
    finally:
        del head.forward
        for p, flag in zip(head.parameters(), flags):
            p.requires_grad_(flag)


def timed(head, feats: list, mode: str) -> float:
    """Seconds for one pass over feats. mode: "train" (forward + backward), "infer" (forward under
    no_grad) or "one-shot" (forward as before chunking: training_path, no graph recorded)."""
    from frozentune.head import Features

    with training_path(head) if mode == "one-shot" else contextlib.nullcontext():
        t = time.perf_counter()
        for hidden, mask in feats:
            if mode == "train":
                head.zero_grad()
                out = head(Features(hidden, mask))
                head.loss(out, torch.zeros(len(mask), dtype=torch.long)).backward()
            else:
                with torch.no_grad():
                    head(Features(hidden, mask))
        return time.perf_counter() - t


def parse_args(doc: str, out: str) -> argparse.Namespace:
    """The options of a head-timing script (this one, ytuning_fold.py); torch pinned to --threads."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--count", type=int, default=30, help="batches per text kind")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / out)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    return a


def write_rows(a: argparse.Namespace, script: str, rows: list[dict]) -> None:
    """The rows of a timing script (this one, ytuning_fold.py, packed_pass.py) to --out, with the
    command, thread count, CPU and repeats that produced them."""
    from frozentune.extract import cpu_summary

    a.out.write_text(json.dumps({"command": f"OMP_NUM_THREADS={a.threads} python bench/{script}", "threads": a.threads,
                                 "cpu": cpu_summary(), "repeats": a.repeats, "rows": rows}, indent=1) + "\n")


def main() -> None:
    a = parse_args(__doc__, "span_packing.json")
    from frozentune.registry import create_method
    from serve_load import long_texts, short_texts

    torch.manual_seed(0)
    head, _ = create_method("selfexplain", 384, 2, {})
    rows = []
    for kind, texts, max_length in (("short (SST-2 test)", short_texts(), 128), ("long (IMDB test)", long_texts(), 128)):
        masks = batches(texts, a.rows, a.count, max_length)
        feats = [(torch.randn(*m.shape, 384), m) for m in masks]
        real = sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)
        for train in (False, True):
            head.train(train)
            # (name, every_slot, mode): every slot first, the eager default last
            modes = ([("every slot", True, "train"), ("default", False, "train")] if train else
                     [("every slot", True, "infer"), ("one shot", False, "one-shot"), ("default", False, "infer")])
            best = dict.fromkeys((m[0] for m in modes), float("inf"))
            for _ in range(a.repeats):
                for name, every, mode in modes:
                    head.every_slot = every
                    best[name] = min(best[name], timed(head, feats, mode))
            head.every_slot = False
            ms = {name: 1000 * t / a.count for name, t in best.items()}
            row = {"texts": kind, "what": "forward + backward" if train else "forward (no grad)", "batches": a.count,
                   "rows": a.rows, "mean_padded_tokens": sum(m.shape[1] for m in masks) / len(masks),
                   "real_token_share": real, "every_slot_ms": ms["every slot"], "default_ms": ms["default"],
                   "speedup": best["every slot"] / best["default"]}
            if not train:
                row.update(one_shot_ms=ms["one shot"], speedup_over_one_shot=best["one shot"] / best["default"])
            rows.append(row)
            print(f"{kind:20s} {row['what']:18s} T≈{row['mean_padded_tokens']:.0f} real {real:.0%}: "
                  + ", ".join(f"{name} {v:.2f} ms" for name, v in ms.items())
                  + f"; default {row['speedup']:.2f}× every slot"
                  + (f", {row['speedup_over_one_shot']:.2f}× one shot" if not train else ""), flush=True)
    write_rows(a, "span_packing.py", rows)


if __name__ == "__main__":
    main()
