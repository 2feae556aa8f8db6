"""ONNX export on MiniLM (issue 18): ONNX Runtime vs PyTorch, per head, and their speed.

  OMP_NUM_THREADS=1 python bench/onnx_parity.py MODEL_DIR... [--texts 256] [--repeats 3]
  (default models: the four SST-2 heads bench/serve_load.py trains into bench/runs/serve-models/heads/*-last)

The models are exported as one graph (`frozentune export --format onnx`). On the first --texts
SST-2 test sentences, batched by 32 in length order as predict batches:
- parity: per output, the largest |ONNX Runtime − PyTorch| over all texts (PyTorch: the same graph
  module in float32 eager), and the largest difference of the softmax probabilities;
- agreement of the predicted label with `frozentune predict --precision fp32`;
- speed: texts/s of ONNX Runtime and of PyTorch eager running the same graph, at batch 1 (the
  first 64 texts one at a time) and batch 32, both on --threads intra-op threads, interleaved,
  best of --repeats; the ratio is ONNX Runtime / PyTorch.
Results: bench/results/onnx_parity.json and .md.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import write_result  # noqa: E402  (bench/run.py)
OUT = HERE / "results" / "onnx_parity"
DEFAULT = [HERE / "runs" / "serve-models" / "heads" / f"{m}-last" for m in ("probe", "ytuning", "space", "selfexplain")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune.data import load_classification
    from frozentune.export.onnx import OnnxClassifier, build_graph, export_onnx, graph_bytes, load_heads, session

    out_dir = HERE / "runs" / "onnx-graph"
    t0 = time.perf_counter()
    meta = export_onnx(a.models, out_dir, overwrite=True)
    export_seconds = time.perf_counter() - t0
    texts = load_classification("sst2").test.texts[:a.texts]
    heads = load_heads(a.models)
    graph = build_graph(heads)
    onnx = OnnxClassifier(out_dir, threads=a.threads)
    sess = session(out_dir / "model.onnx", a.threads)
    bb = heads[0][1].backbone_ref
    tk = bb.tokenize(texts)
    order = np.argsort(-tk.lengths, kind="stable")

    def batches(size: int, n: int):
        idx = order[:n] if size > 1 else np.arange(n)
        return [tk.padded(idx[s:s + size], bb.pad_id())[:2] for s in range(0, n, size)]

    # parity over every text
    worst: dict[str, float] = {}
    prob_worst: dict[str, float] = {}
    for ids, mask in batches(32, len(texts)):
        with torch.no_grad():
            want = [w.numpy() for w in graph(ids, mask)]
        got = sess.run(graph.output_names, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        for name, g, w in zip(graph.output_names, got, want):
            worst[name] = max(worst.get(name, 0.0), float(np.abs(g - w).max()))
            if name.endswith(".logits"):
                pg, pw = (torch.softmax(torch.from_numpy(x), -1).numpy() for x in (g, w))
                prob_worst[name] = max(prob_worst.get(name, 0.0), float(np.abs(pg - pw).max()))
    rows = onnx.predict(texts)
    agree = {}
    for name, m in heads:
        ref = api.predict(m, texts, precision="fp32", log=lambda s: None)
        agree[name] = sum(r["tasks"][name]["label"] == p["label"] for r, p in zip(rows, ref)) / len(texts)

    # speed, interleaved, best of repeats
    def rate(run, bs) -> float:
        t = time.perf_counter()
        n = 0
        for ids, mask in bs:
            run(ids, mask)
            n += ids.shape[0]
        return n / (time.perf_counter() - t)

    def ort_run(ids, mask):
        sess.run(graph.output_names, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})

    def torch_run(ids, mask):
        with torch.no_grad():
            graph(ids, mask)

    speed = {}
    for size, n in ((1, 64), (32, len(texts))):
        bs = batches(size, n)
        ort_run(*bs[0]), torch_run(*bs[0])  # warm-up
        best = {"onnxruntime": 0.0, "pytorch": 0.0}
        for _ in range(a.repeats):
            best["onnxruntime"] = max(best["onnxruntime"], rate(ort_run, bs))
            best["pytorch"] = max(best["pytorch"], rate(torch_run, bs))
        speed[f"batch {size}"] = {**{k: round(v, 1) for k, v in best.items()},
                                  "ratio": round(best["onnxruntime"] / best["pytorch"], 3)}
    import onnxruntime

    result = {"models": [str(m) for m in a.models], "heads": [n for n, _ in heads], "texts": len(texts),
              "graph_mib": round(graph_bytes(out_dir) / 2**20, 1),
              "export_seconds": round(export_seconds, 1), "export_check": meta["check"],
              "max_abs_diff": worst, "max_abs_prob_diff": prob_worst, "label_agreement_with_predict_fp32": agree,
              "speed_texts_per_s": speed, "threads": a.threads,
              "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
              "machine": f"{platform.machine()}, {a.threads} thread(s)", "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": "python bench/onnx_parity.py " + " ".join(sys.argv[1:])}
    lines = ["| output | max abs difference (ORT − PyTorch) | max abs probability difference | labels equal to predict --precision fp32 |",
             "|---|---:|---:|---:|"]
    for name in graph.output_names:
        head = name.split(".")[0]
        lines.append(f"| {name} | {worst[name]:.2e} | {prob_worst.get(name, float('nan')):.2e} | "
                     + (f"{100 * agree[head]:.1f}% |" if name.endswith(".logits") else "– |"))
    lines += ["", "| batch | ONNX Runtime texts/s | PyTorch eager texts/s | ratio |", "|---:|---:|---:|---:|"]
    for k, v in speed.items():
        lines.append(f"| {k.split()[1]} | {v['onnxruntime']} | {v['pytorch']} | {v['ratio']:.2f}× |")
    lines.append(f"\n{len(texts)} SST-2 test sentences, MiniLM, {len(heads)} heads in one {result['graph_mib']} MiB graph "
                 f"(export {result['export_seconds']} s); {a.threads} thread(s), best of {a.repeats}, interleaved; "
                 f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}; {result['date']}. `{result['command'].strip()}`")
    write_result(OUT, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
