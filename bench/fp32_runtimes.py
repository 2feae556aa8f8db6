"""Other runtimes for the fp32 backbone pass, on a CPU where no reduced precision is faster (issue 16).

  OMP_NUM_THREADS=1 python bench/fp32_runtimes.py --out bench/results/fp32_runtimes-avx2.json

On a CPU with AVX2 only, fp32 is the default pass: bf16 and fp16 run 0.13-0.16x its speed and int8's
product 0.03x (bench/results/precision_speed-avx2-native.json), and int8 through torch's quantized engine
1.23-1.30x at 1.5x Int8Linear's error (bench/results/int8_engine-avx2.json). This asks whether another
runtime runs the *same* fp32 arithmetic faster than PyTorch eager:
  torch       the library's pass: the Hugging Face model with its "sdpa" attention, eager;
  compiled    torch.compile(model, dynamic=True) (Inductor, C++ kernels; needs a C++ compiler);
  ort         ONNX Runtime 1.x, CPU provider, all graph optimisations, on the model exported by
              torch.onnx's dynamo exporter (as `frozentune export --format onnx` exports);
  ort-fused   ONNX Runtime on the graph its transformers optimizer rewrites for BERT (fused Attention,
              SkipLayerNormalization, BiasGelu, EmbedLayerNormalization); that optimizer recognises the
              eager attention of the TorchScript exporter's graph, so this one is exported that way.

Every runner gets the same batches (the extractor's length-sorted token-budget batches, `iter_states`,
max_tokens 8192) of the first --sst2 SST-2 train sentences (max_length 128) and the first --imdb IMDB
train reviews (max_length 256); all runners interleaved in --repeats rounds after one warm-up round
(compiled's warm-up is its compilation, reported); median seconds and the ratio of fp32 eager's median
to each runner's. Agreement: the largest absolute difference of last-layer states from eager's, over
real tokens. Exports are made from copies, never the model timed. A probe, not the library's path.
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


class Ort:
    """An ONNX Runtime session called like the Hugging Face model: (input_ids=, attention_mask=) →
    an object with last_hidden_state (B, T, D), fp32 on the CPU."""

    def __init__(self, path: Path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.training = False

    def parameters(self):
        return iter(())

    def buffers(self):
        return iter(())

    def __call__(self, input_ids, attention_mask, **_):
        import torch

        (h,) = self.session.run(None, {"ids": input_ids.numpy(), "mask": attention_mask.numpy()})
        return SimpleNamespace(last_hidden_state=torch.from_numpy(h))


def export(model, folder: Path, name: str, dynamo: bool) -> Path:
    """The encoder's last-layer states as an ONNX graph, (ids, mask) → h, batch and tokens dynamic."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    path = folder / f"{name}.onnx"
    ids = torch.tensor([[101, 7592, 2088, 102, 0], [101, 1037, 1038, 1039, 102]])
    mask = (ids != 0).long()
    kw = ({"dynamic_shapes": ({0: torch.export.Dim("b"), 1: torch.export.Dim("t")},) * 2} if dynamo else
          {"dynamic_axes": {"ids": {0: "b", 1: "t"}, "mask": {0: "b", 1: "t"}, "h": {0: "b", 1: "t"}}})
    torch.onnx.export(Encoder(model).eval(), (ids, mask), str(path), input_names=["ids", "mask"], output_names=["h"],
                      opset_version=18, dynamo=dynamo, **kw)
    return path


def fused(path: Path, config) -> Path:
    from onnxruntime.transformers import optimizer

    m = optimizer.optimize_model(str(path), model_type="bert", num_heads=config.num_attention_heads,
                                 hidden_size=config.hidden_size)
    out = path.with_name(path.stem + "-fused.onnx")
    m.save_model_to_file(str(out))
    return out, {k: v for k, v in m.get_fused_operator_statistics().items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sst2", type=int, default=2000)
    ap.add_argument("--imdb", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runners", default="torch,compiled,ort,ort-fused")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import numpy as np
    import onnxruntime
    import torch
    from precision_speed import pass_seconds

    torch.set_num_threads(1)
    from frozentune.backbone import Backbone, LayerSpec, iter_states
    from frozentune.data import data_root, read_split
    from frozentune.extract.device import cpu_summary

    root = data_root()
    bb = Backbone.load("minilm", max_length=128)
    model = bb.model.eval()
    names = a.runners.split(",")
    runners: dict = {"torch": model}
    notes: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "compiled" in names:
            runners["compiled"] = torch.compile(copy.deepcopy(model), dynamic=True)
        if "ort" in names:
            runners["ort"] = Ort(export(copy.deepcopy(model), Path(tmp), "sdpa-dynamo", dynamo=True))
        if "ort-fused" in names:
            from transformers import AutoModel

            eager = AutoModel.from_pretrained(model.name_or_path, attn_implementation="eager").eval()
            path, notes["ort-fused operators"] = fused(export(eager, Path(tmp), "eager-script", dynamo=False), model.config)
            runners["ort-fused"] = Ort(path)
        slices = {"sst2": (a.sst2, 128), "imdb": (a.imdb, 256)}
        out = {"cpu": cpu_summary(), "machine": platform.machine(), "torch": torch.__version__,
               "onnxruntime": onnxruntime.__version__, "threads": 1, "repeats": a.repeats, **notes, "data": {}}
        for data, (n, max_length) in slices.items():
            bb.max_length = max_length
            tokens = bb.tokenize(list(read_split(root / data / "train.jsonl").texts)[:n])
            ref = {}
            for idx, s, mask in iter_states(model, bb.tok, tokens, LayerSpec(), max_tokens=8192):
                for r, i in enumerate(idx):
                    ref[int(i)] = s[r, : int(mask[r].sum())].float().numpy()
            diff, warm = {}, {}
            for name, r in runners.items():
                t0 = time.perf_counter()
                got = {}
                with torch.inference_mode():
                    for idx, s, mask in iter_states(r, bb.tok, tokens, LayerSpec(), max_tokens=8192):
                        for row, i in enumerate(idx):
                            got[int(i)] = s[row, : int(mask[row].sum())].float().numpy()
                warm[name] = time.perf_counter() - t0
                diff[name] = max(float(np.abs(got[i] - ref[i]).max()) for i in ref)
            secs: dict = {n: [] for n in runners}
            for _ in range(a.repeats):
                for name, r in runners.items():
                    with torch.inference_mode():
                        secs[name].append(pass_seconds(r, bb.tok, tokens))
            base = statistics.median(secs["torch"])
            out["data"][data] = {
                "texts": n, "max_length": max_length, "tokens": int(tokens.lengths.sum()), "seconds": secs,
                "warm_up_seconds": warm, "max_abs_diff_vs_torch": diff,
                "vs_torch": {k: base / statistics.median(v) for k, v in secs.items()},
                "tokens_per_s": {k: int(tokens.lengths.sum()) / statistics.median(v) for k, v in secs.items()}}
    print(out["cpu"])
    print(f"{'runner':<12} " + " ".join(f"{d + ' x torch':>13} {d + ' tok/s':>11} {'max |diff|':>10}" for d in slices))
    for name in runners:
        cells = []
        for d in slices:
            r = out["data"][d]
            cells.append(f"{r['vs_torch'][name]:>12.2f}x {r['tokens_per_s'][name]:>11.0f} {r['max_abs_diff_vs_torch'][name]:>10.1e}")
        print(f"{name:<12} " + " ".join(cells))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
