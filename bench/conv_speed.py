"""Speed and memory of the four encoders against sequence length, at a constant number of tokens
per batch (batch = tokens / length), forward + backward (loss = sum of the output states; no
optimiser step).

  python bench/conv_speed.py                       # lengths 128 … 8192, 16,384 tokens per batch, 3 repeats
  python bench/conv_speed.py --lengths 128,256 --tokens 1024 --repeats 1 --dim 32 --layers 1   # smoke test

Throughput: one process; at each length every arch is warmed up once, then the repeats run
interleaved (light, dynamic, dilated, transformer, light, …) so background load hits them alike;
the median time gives tokens/s. No padding, so attention runs without a mask.
Memory: on CPU, each (arch, length) runs one forward + backward in a fresh process (this script
with --child), which reports its peak RSS (VmHWM of /proc/self/status) and its RSS just before the step
(after a tiny warm-up step, so the library code a first step loads is not counted; glibc's mmap
threshold is fixed so freed blocks leave RSS);
`step MB` = peak − before is what the step itself added (activations, gradients, temporaries).
PyTorch has no CPU allocator statistics, and tracemalloc does not see its allocations. On CUDA it
is torch.cuda.max_memory_allocated around the step, in this process.

Writes bench/results/conv-speed.json and bench/conv-speed.png, and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import machine  # noqa: E402  (bench/run.py: the machine description every result records)

from frozentune.api import peak_rss_mb  # noqa: E402  (VmHWM on Linux)
from frozentune.conv.encoder import ARCHS, CONVS, Encoder, EncoderConfig, parameter_counts  # noqa: E402

VOCAB = 30522  # the MiniLM WordPiece vocabulary


def build(arch: str, a: argparse.Namespace, length: int, device: str) -> Encoder:
    torch.manual_seed(0)
    cfg = EncoderConfig(arch=arch, layers=a.layers, dim=a.dim, heads=a.heads, kernel_size=a.kernel_size,
                        ffn_dim=a.ffn_dim, dropout=0.0, max_length=length)
    return Encoder(cfg, VOCAB).to(device).train()


def batch(length: int, tokens: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    rows = max(1, tokens // length)
    ids = torch.randint(1000, VOCAB, (rows, length), generator=torch.Generator().manual_seed(length))
    return ids.to(device), torch.ones(rows, length, dtype=torch.bool, device=device)


def step(enc: Encoder, ids: torch.Tensor, mask: torch.Tensor) -> None:
    enc.zero_grad(set_to_none=True)
    enc(ids, mask).sum().backward()


def timed(enc: Encoder, ids: torch.Tensor, mask: torch.Tensor) -> float:
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    step(enc, ids, mask)
    sync()
    return time.perf_counter() - t0


def rss_mb() -> float:
    import psutil
    return psutil.Process().memory_info().rss / 2 ** 20


def child(a: argparse.Namespace) -> None:
    """One forward + backward of (arch, length) in this fresh process; prints its memory as JSON."""
    enc = build(a.child, a, a.length, "cpu")
    ids, mask = batch(a.length, a.tokens, "cpu")
    step(enc, ids[:1, :8], mask[:1, :8])  # a tiny step first: the library code it touches is not the step's memory
    enc.zero_grad(set_to_none=True)
    before = rss_mb()
    step(enc, ids, mask)
    peak = peak_rss_mb()
    print(json.dumps({"peak_rss_mb": peak, "before_rss_mb": before, "step_mb": max(0.0, peak - before)}))


def memory(arch: str, length: int, a: argparse.Namespace) -> dict:
    if a.device.startswith("cuda"):
        enc = build(arch, a, length, a.device)
        ids, mask = batch(length, a.tokens, a.device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step(enc, ids, mask)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        del enc, ids, mask
        torch.cuda.empty_cache()
        return {"peak_allocated_mb": peak / 2 ** 20, "step_mb": (peak - base) / 2 ** 20}
    cmd = [sys.executable, __file__, "--child", arch, "--length", str(length), "--tokens", str(a.tokens),
           "--layers", str(a.layers), "--dim", str(a.dim), "--heads", str(a.heads),
           "--kernel-size", str(a.kernel_size), "--ffn-dim", str(a.ffn_dim)]
    # a fixed mmap threshold: glibc then returns every large block to the OS when it is freed, so RSS
    # follows the live tensors instead of what the heap kept
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"failed": proc.returncode, "stderr_tail": proc.stderr[-400:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_memory = all("step_mb" in r["memory"] for r in rows)
    fig, axes = plt.subplots(1, 2 if with_memory else 1, figsize=(11 if with_memory else 5.8, 4.2), squeeze=False)
    panels = [(axes[0][0], "tokens / s (forward + backward)", lambda r: r["tokens_per_s"], "log")]
    if with_memory:
        panels.append((axes[0][1], "memory added by one step (MB)", lambda r: r["memory"]["step_mb"], "linear"))
    for ax, ylabel, value, yscale in panels:
        for arch in ARCHS:
            mine = [r for r in rows if r["arch"] == arch]
            ax.plot([r["length"] for r in mine], [value(r) for r in mine], marker="o", label=arch)
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        if yscale == "linear":
            ax.set_ylim(bottom=0)
        ax.set_xlabel("sequence length (tokens per batch constant)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: list[dict], lengths: list[int]) -> str:
    out = ["| length | batch | " + " | ".join(f"{a} tok/s" for a in ARCHS) + " | " + " | ".join(f"{a} MB" for a in ARCHS) + " |",
           "|---:|---:|" + "---:|" * (2 * len(ARCHS))]
    for L in lengths:
        r = {x["arch"]: x for x in rows if x["length"] == L}
        mem = [r[a]["memory"] for a in ARCHS]
        out.append(f"| {L} | {r[ARCHS[0]]['batch']} | " + " | ".join(f"{r[a]['tokens_per_s']:,.0f}" for a in ARCHS) + " | "
                   + " | ".join(f"{m['step_mb']:,.0f}" if "step_mb" in m else ("failed" if m else "–") for m in mem) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="128,256,512,1024,2048,4096,8192")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch at every length")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kernel-size", type=int, default=7)
    ap.add_argument("--ffn-dim", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "conv-speed.json")
    ap.add_argument("--plot", type=Path, default=HERE / "conv-speed.png")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    lengths = [int(x) for x in a.lengths.split(",")]
    threads = torch.get_num_threads()
    rows = []
    for L in lengths:
        encs = {arch: build(arch, a, L, a.device) for arch in ARCHS}
        ids, mask = batch(L, a.tokens, a.device)
        for arch in ARCHS:
            timed(encs[arch], ids, mask)  # warm-up
        times: dict[str, list[float]] = {arch: [] for arch in ARCHS}
        for _ in range(a.repeats):
            for arch in ARCHS:
                times[arch].append(timed(encs[arch], ids, mask))
        del encs
        for arch in ARCHS:
            med = statistics.median(times[arch])
            row = {"arch": arch, "length": L, "batch": ids.shape[0], "tokens": ids.numel(), "times_s": times[arch],
                   "median_s": med, "tokens_per_s": ids.numel() / med,
                   "memory": {} if a.no_memory else memory(arch, L, a)}
            rows.append(row)
            print(f"length {L:>5} × {ids.shape[0]:>4}  {arch:<11} {row['tokens_per_s']:>10,.0f} tok/s  "
                  f"step memory {row['memory'].get('step_mb', float('nan')):>8,.0f} MB", flush=True)

    ratios = {}
    for L in lengths:
        tr = next(r for r in rows if r["arch"] == "transformer" and r["length"] == L)["tokens_per_s"]
        ratios[str(L)] = {arch: next(r for r in rows if r["arch"] == arch and r["length"] == L)["tokens_per_s"] / tr
                          for arch in CONVS}
    shape = {"layers": a.layers, "dim": a.dim, "heads": a.heads, "kernel_size": a.kernel_size, "ffn_dim": a.ffn_dim}
    from frozentune.conv.encoder import EncoderShape
    result = {"name": "conv-speed", "command": "python bench/conv_speed.py " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
              "machine": machine(threads) + (f", {torch.cuda.get_device_name()}" if a.device.startswith("cuda") else ""),
              "date": time.strftime("%Y-%m-%d %H:%M"), "device": a.device, "threads": threads,
              "tokens_per_batch": a.tokens, "repeats": a.repeats, "shape": shape,
              "params": parameter_counts(EncoderShape(**shape), VOCAB, max(lengths)),
              "memory_method": ("torch.cuda.max_memory_allocated around one step" if a.device.startswith("cuda") else
                                "fresh process per (arch, length): peak RSS (VmHWM) after one step minus RSS just before it"),
              "rows": rows, "throughput_vs_transformer": ratios}
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=2))
    plot(rows, a.plot, f"{a.layers} layers, width {a.dim}, {a.tokens:,} tokens per batch, {result['machine']}")
    print(table(rows, lengths))
    for L in lengths:
        print(f"throughput / Transformer's at {L}: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios[str(L)].items()))
    print(f"wrote {a.output} and {a.plot}")


if __name__ == "__main__":
    main()
