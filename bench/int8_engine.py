"""int8 on torch's quantized engine (fbgemm / oneDNN), for CPUs where torch._int_mm is slow (issue 16).

  OMP_NUM_THREADS=1 python bench/int8_engine.py --out bench/results/int8_engine-avx2.json

--precision int8 runs Int8Linear: per-row asymmetric 8-bit activations, per-channel symmetric weights,
the product by torch._int_mm. On an AMD EPYC with AVX2 only that product runs a slow kernel (0.03x fp32,
bench/results/precision_speed-avx2-native.json). This probes the other int8 kernels torch has on every
x86 CPU: `torch.ops.quantized.linear_dynamic`, which quantises its input with one scale per tensor. Each
row is first mapped onto [0, 1] (x' = (x − lo) / (hi − lo), lo ≤ 0 ≤ hi per row, as Int8Linear's range),
so that the one scale is each row's own; y = (hi − lo)·(x'·Wqᵀ) + lo·ΣWq + b. Variants: weight levels
±127 or ±63, and reduce_range (7-bit activations). Without VNNI the u8·s8 pair sums are int16 and
saturate unless weights or activations give up a bit (2·255·127 > 32767).

MiniLM, fp32 states as reference: per-token relative L2 error ‖s − s32‖ / ‖s32‖ (mean, max) on the first
--errors-n SST-2 test sentences at layer 4 and the last layer; speed: the frozen pass over the first
--texts SST-2 train texts (max_length 128), all runners interleaved in --repeats rounds, median seconds
and the ratio to fp32's median. A probe, not the library's path: nothing here is used by frozentune.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def engine_model(model, levels: int, reduce_range: bool):
    import torch
    from torch import nn

    from frozentune.extract.precision import _frozen_copy

    class EngineLinear(nn.Module):
        def __init__(self, linear: nn.Linear):
            super().__init__()
            w = linear.weight.detach().float()
            sw = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / levels
            wq = torch.quantize_per_channel(w, sw.double(), torch.zeros(len(sw), dtype=torch.long), 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(wq, None)
            self.register_buffer("wsum", wq.dequantize().sum(1))
            bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(w.shape[0])
            self.register_buffer("bias", bias)
            self.out_features = w.shape[0]

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, shape[-1])
            lo = x.amin(1, keepdim=True).clamp_max(0)
            r = (x.amax(1, keepdim=True).clamp_min(0) - lo).clamp_min_(torch.finfo(torch.float32).tiny)
            out = torch.ops.quantized.linear_dynamic((x - lo).div_(r), self.packed, reduce_range)
            out.mul_(r).addmm_(torch.cat([lo, torch.ones_like(lo)], 1), torch.stack([self.wsum, self.bias]))
            return out.reshape(*shape[:-1], self.out_features)

    c = _frozen_copy(model, torch.device("cpu"))
    for parent in list(c.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, EngineLinear(child))
    return c.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="fbgemm,onednn")
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--errors-n", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from precision_speed import pass_seconds, token_states

    from frozentune.backbone import Backbone
    from frozentune.data import data_root, read_split
    from frozentune.extract.device import cpu_summary
    from frozentune.extract.precision import int8_weight_levels, prepare

    root, cpu = data_root(), torch.device("cpu")
    bb = Backbone.load("minilm", max_length=128)
    runners = {"fp32": prepare(bb.model, "fp32", cpu), "int8 (Int8Linear, torch._int_mm)": prepare(bb.model, "int8", cpu)}
    engines = {}
    for eng in a.engines.split(","):
        torch.backends.quantized.engine = eng
        for levels, rr in ((127, True), (63, False), (127, False)):
            name = f"{eng}: weights ±{levels}, {'7' if rr else '8'}-bit activations"
            runners[name], engines[name] = engine_model(bb.model, levels, rr), eng

    def engine_of(name: str) -> None:
        if name in engines:
            torch.backends.quantized.engine = engines[name]

    test = bb.tokenize(list(read_split(root / "sst2" / "test.jsonl").texts)[: a.errors_n])
    errors: dict = {}
    for layer in (4, -1):
        ref = token_states(runners["fp32"], bb.tok, test, layer)
        for name, r in runners.items():
            if name != "fp32":
                engine_of(name)
                rel = (token_states(r, bb.tok, test, layer) - ref).norm(dim=-1) / ref.norm(dim=-1)
                errors.setdefault(name, {})[f"layer{layer}"] = {"mean": float(rel.mean()), "max": float(rel.max())}
    del runners["int8 (Int8Linear, torch._int_mm)"]  # 0.03x fp32 on an AVX2-only CPU: minutes per round
    tokens = bb.tokenize(list(read_split(root / "sst2" / "train.jsonl").texts)[: a.texts])
    secs: dict = {n: [] for n in runners}
    for n, r in runners.items():  # warm-up
        engine_of(n)
        pass_seconds(r, bb.tok, tokens)
    for _ in range(a.repeats):
        for n, r in runners.items():
            engine_of(n)
            secs[n].append(pass_seconds(r, bb.tok, tokens))
    fp32 = statistics.median(secs["fp32"])
    out = {"cpu": cpu_summary(), "machine": platform.machine(), "torch": torch.__version__, "threads": 1,
           "int8_weight_levels (torch._int_mm exact at)": int8_weight_levels(),
           "texts": a.texts, "tokens": int(tokens.lengths.sum()), "errors_n": a.errors_n, "errors": errors,
           "seconds": secs, "vs_fp32": {n: fp32 / statistics.median(s) for n, s in secs.items()}}
    print(f"{'runner':<44} {'x fp32':>7} {'layer 4 mean/max %':>20} {'last mean/max %':>18}")
    for n in runners:
        e = errors.get(n)
        cell = (lambda k: f"{e[k]['mean'] * 100:.2f} / {e[k]['max'] * 100:.2f}") if e else (lambda k: "0")
        print(f"{n:<44} {out['vs_fp32'][n]:>6.2f}x {cell('layer4'):>20} {cell('layer-1'):>18}")
    for n, e in errors.items():
        if n not in runners:
            print(f"{n:<44} {'(not timed)':>7} {e['layer4']['mean'] * 100:.2f} / {e['layer4']['max'] * 100:.2f}"
                  f"   {e['layer-1']['mean'] * 100:.2f} / {e['layer-1']['max'] * 100:.2f}")
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
