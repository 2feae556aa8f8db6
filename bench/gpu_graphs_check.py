"""Before a GPU's serving run: the 8 heads of serve_load.py as CUDA graphs (serve --cuda-graphs auto) against
the same engine without them, on 16 short and 16 long texts and on 5 short ones (rows padded to 8).

Prints and writes: each head's agreement in labels and the largest difference in probabilities, which
heads were recorded (or why not), and the whole batch's time in the server's own call with and without
graphs (serve_load.head_costs). Exit 1 where an engine fails; a head that cannot be recorded is
reported, not fatal (it runs without a graph, as in the server).

    python bench/gpu_graphs_check.py --models .gpu/serve/models --device cuda --out $OUT/gpu_graphs_check.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=None, help="serve_load's models folder (its heads/ inside)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    import torch

    import serve_load as sl
    from frozentune.serve.engine import Engine, ServeOptions

    torch.set_num_threads(1)
    heads = (a.models or sl.MODELS) / "heads"
    folders = [heads / n for n, _, _ in sl.HEADS]
    texts = {"short16": sl.short_texts()[:16], "long16": sl.long_texts()[:16], "short5": sl.short_texts()[16:21]}
    lines: list[str] = []
    answers = {}
    for graphs in ("auto", "off"):
        e = Engine.load(folders, a.device, options=ServeOptions(cuda_graphs=graphs), log=lines.append)
        try:
            answers[graphs] = {k: [e.classify(v) for _ in range(2)][-1] for k, v in texts.items()}
            g = e.groups[0].graphs
            if graphs == "auto":
                recorded = g.describe() if g is not None else "graphs off"
                failed = dict(g.failed) if g is not None else {}
        finally:
            e.close()
    agree = {}
    for k in texts:
        for name in answers["off"][k]["tasks"]:
            rows = list(zip(answers["auto"][k]["results"], answers["off"][k]["results"]))
            same = sum(x["tasks"][name]["label"] == y["tasks"][name]["label"] for x, y in rows)
            diff = max(abs(p - q) for x, y in rows for p, q in zip(x["tasks"][name]["scores"].values(),
                                                                      y["tasks"][name]["scores"].values()))
            agree.setdefault(name, {})[k] = {"same_label": f"{same}/{len(rows)}", "max_prob_diff": diff}
    costs = sl.head_costs(heads, 1, a.device)
    out = {"device": a.device, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "recorded": recorded, "failed": failed, "agreement": agree, "head_costs": costs,
           "log": [x for x in lines if "CUDA graph" in x or "graphs" in x]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("recorded", "failed", "agreement", "log")}, indent=1))
    for k, r in costs["texts"].items():
        print(k, "batch ms with graphs", r["group_run_ms"], "without", r.get("group_run_ms_no_graphs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
