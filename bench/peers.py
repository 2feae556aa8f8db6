"""Peers in the same run (issue 18): PEFT LoRA and PEFT prefix-tuning on MiniLM beside frozentune's
frozen heads and its encoder prefix, on the same data, the same thread, one process.

  OMP_NUM_THREADS=1 python bench/peers.py --threads 1 --data trec,sst2     # resumes: done rows are kept
  python bench/peers.py --report                                           # table + plot from results/peers*.json

`--parts frozentune,peft,sweep` splits the work between processes (each with its own `--out
results/peers-NAME.json`), e.g. the frozentune part in one and the PEFT part in another, one thread each.

What runs, per dataset (train split minus the carved validation, as `frozentune train` uses it):
- frozentune: probe, space, ytuning, selfexplain through `api.train` with their defaults, on a cache
  folder emptied at the start, so the first head on each layer pays for the extraction (space reads
  hidden state -3, the others the last layer); then the encoder prefix (`--method prefix`, live).
- PEFT 0.21 on `AutoModelForSequenceClassification` (MiniLM + its pooler + a new linear layer):
  LoRA r 8, alpha 16, dropout 0.1 on query/value, lr 3e-4; prefix-tuning, 20 virtual tokens, lr 1e-2.
  Both are the values of PEFT's own sequence-classification examples. AdamW, batch 32, linear decay
  after 6% warm-up, max_length 128; shuffled batches as Hugging Face's Trainer draws them by default,
  or with `--bucketed` the length-bucketed batches frozentune's live methods train on (padding is
  most of the difference in seconds per step); no early stopping (the test set is scored at a few points along
  the way for the curve, outside the timed training).
- Live methods get the same budget of passes over train: `--live-epochs` (TREC 5, SST-2 1 by default;
  one SST-2 epoch is about 1,900 steps of MiniLM forward and backward).
- Marginal cost of more points on the same data: five probe points (lr 1e-3/1e-2 × seeds) on the
  cache the heads built, against a second LoRA point (lr 1e-3), each timed on its own.

Seconds are wall time of one pinned thread; extraction runs in this CPU's default cache precision
(bf16 where the CPU has AVX-512 BF16), PEFT and the live methods in fp32.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
from few_shot import METHODS as HEADS  # noqa: E402  (bench/few_shot.py: the four frozen heads)
PEFT_LR = {"lora": 3e-4, "peft-prefix": 1e-2}
LIVE_EPOCHS = {"trec": 5, "sst2": 1}
PROBE_POINTS = [(1e-2, 0), (1e-3, 0), (1e-2, 1), (1e-3, 1), (1e-2, 2)]


def layer_of(method: str) -> str:
    """The hidden state a frozentune method reads by default (its registration; the last if none)."""
    from frozentune.registry import get_method

    return get_method(method).layer or "-1"


def token_lengths(tok, texts: list[str]) -> np.ndarray:
    """(N,) MiniLM token counts of texts, truncated at max_length 128 as every run here encodes them."""
    return np.array([len(x) for x in tok(texts, truncation=True, max_length=128)["input_ids"]])


def peft_model(kind: str, n_labels: int, seed: int):
    """MiniLM for sequence classification wrapped by PEFT: 'lora' or 'peft-prefix'."""
    import torch
    from peft import LoraConfig, PrefixTuningConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from frozentune.backbone import resolve_name

    torch.manual_seed(seed)
    base = AutoModelForSequenceClassification.from_pretrained(resolve_name("minilm"), num_labels=n_labels)
    cfg = (LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.1,
                      target_modules=["query", "value"]) if kind == "lora"
           else PrefixTuningConfig(task_type=TaskType.SEQ_CLS, num_virtual_tokens=20))
    return get_peft_model(base, cfg)


def accuracy(model, tok, texts: list[str], y: np.ndarray, batch: int = 64) -> float:
    """Test accuracy in %, eval mode, no gradients."""
    import torch

    model.eval()
    pred = []
    with torch.no_grad():
        for s in range(0, len(texts), batch):
            enc = tok(texts[s:s + batch], padding=True, truncation=True, max_length=128, return_tensors="pt")
            pred.append(model(**enc).logits.argmax(-1).numpy())
    model.train()
    return 100.0 * float((np.concatenate(pred) == y).mean())


def epoch_batches(lengths: np.ndarray, rng: np.random.Generator, bucketed: bool) -> list[np.ndarray]:
    """Batches of 32 for one epoch: shuffled (Hugging Face Trainer's default) or frozentune's
    length-bucketed batches (train.train_batches), which its live methods use."""
    from frozentune.train import train_batches

    if bucketed:
        return train_batches(lengths, 32, rng)
    order = rng.permutation(len(lengths))
    return [order[s:s + 32] for s in range(0, len(order), 32)]


def padding(data: str) -> dict:
    """Token positions one epoch of batches of 32 holds, shuffled against length-bucketed, for the
    train split's MiniLM tokens (max_length 128), seed 0."""
    from transformers import AutoTokenizer

    from frozentune.backbone import resolve_name
    from frozentune.data import load_classification

    texts = load_classification(data, seed=0).train.texts
    tok = AutoTokenizer.from_pretrained(resolve_name("minilm"))
    lengths = token_lengths(tok, texts)
    held = {kind: int(sum(lengths[b].max() * len(b) for b in epoch_batches(lengths, np.random.default_rng(0), kind)))
            for kind in (False, True)}
    return {"data": data, "real_tokens": int(lengths.sum()), "shuffled": held[False], "bucketed": held[True],
            "ratio": held[False] / held[True]}


def train_peft(kind: str, ds, epochs: int, lr: float, seed: int, bucketed: bool = False, scores: int = 4) -> dict:
    """One PEFT run: AdamW, batch 32, linear decay after 6% warm-up; the test set is scored `scores`
    times along the way (outside the timed part) and at the end."""
    import torch
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    from frozentune.backbone import resolve_name

    tok = AutoTokenizer.from_pretrained(resolve_name("minilm"))
    model = peft_model(kind, len(ds.labels), seed)
    y_tr = torch.as_tensor(ds.label_ids(ds.train))
    texts, y_te = ds.train.texts, ds.label_ids(ds.test)
    per_epoch = math.ceil(len(texts) / 32)
    total = per_epoch * epochs
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    sched = get_linear_schedule_with_warmup(opt, int(0.06 * total), total)
    every = math.ceil(total / scores)
    rng = np.random.default_rng(seed)
    lengths = token_lengths(tok, texts)
    curve, secs, step = [], 0.0, 0
    model.train()
    for _ in range(epochs):
        for idx in epoch_batches(lengths, rng, bucketed):
            t0 = time.perf_counter()
            enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=128, return_tensors="pt")
            loss = model(**enc, labels=y_tr[idx]).loss
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            secs += time.perf_counter() - t0
            step += 1
            if step % every == 0 or step == total:
                curve.append([step, secs, accuracy(model, tok, ds.test.texts, y_te)])
    return {"accuracy": curve[-1][2], "train_seconds": secs, "steps": total, "epochs": epochs, "lr": lr,
            "batches": "bucketed" if bucketed else "shuffled",
            "curve": curve, "trainable_params": sum(p.numel() for p in params)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="trec,sst2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--live-epochs", default="", help="e.g. trec=5,sst2=1 (the defaults)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "peers.json")
    ap.add_argument("--parts", default="frozentune,peft,sweep",
                    help="which parts to run (comma-separated): frozentune, peft, sweep; parts run as separate "
                         "processes write separate --out files, which --report joins")
    ap.add_argument("--second-lora", default="trec", help="data on which the sweep part also times a 2nd LoRA point")
    ap.add_argument("--bucketed", action="store_true",
                    help="PEFT runs on frozentune's length-bucketed batches (rows named NAME-bucketed) instead of "
                         "shuffled ones")
    ap.add_argument("--report", action="store_true", help="table + plot from every results/peers*.json")
    ap.add_argument("--padding", action="store_true", help="token positions per epoch, shuffled vs bucketed batches")
    a = ap.parse_args()
    if a.padding:
        print("| data | real tokens | held by shuffled batches | by bucketed batches | ratio |\n|---|---:|---:|---:|---:|")
        for data in a.data.split(","):
            r = padding(data)
            print(f"| {data} | {r['real_tokens']:,} | {r['shuffled']:,} | {r['bucketed']:,} | {r['ratio']:.2f} |")
        return
    if a.report:
        print(report(_joined(sorted((HERE / "results").glob("peers*.json"))), HERE / "peers.png"))
        return
    parts = set(a.parts.split(","))
    import torch

    torch.set_num_threads(a.threads)
    from frozentune import api
    from frozentune.data import load_classification
    from frozentune.extract.device import cpu_summary

    live_epochs = {**LIVE_EPOCHS, **{k: int(v) for k, v in (p.split("=") for p in a.live_epochs.split(",") if p)}}
    done = json.loads(a.out.read_text()) if a.out.exists() else {
        "command": "bench/peers.py " + " ".join(sys.argv[1:]), "threads": a.threads, "cpu": cpu_summary(),
        "machine": platform.machine(), "torch": torch.__version__, "rows": []}
    have = {(r["data"], r["name"]) for r in done["rows"]}

    def save(row: dict) -> None:
        done["rows"].append(row)
        a.out.write_text(json.dumps(done, indent=1))
        print(json.dumps({k: v for k, v in row.items() if k != "curve"}), flush=True)

    for data in a.data.split(","):
        ds = load_classification(data, seed=0)
        cache = HERE / "runs" / f"peers-cache-{data}"
        if "frozentune" in parts and not any((data, m) in have for m in HEADS):
            shutil.rmtree(cache, ignore_errors=True)  # the first head on each layer pays for its extraction
        for method in (*HEADS, "prefix") if "frozentune" in parts else ():
            if (data, method) in have:
                continue
            cfg = {"seed": 0, **({"epochs": live_epochs[data]} if method == "prefix" else {})}
            t0 = time.perf_counter()
            r = api.train(method, data, api.BackboneOptions(), train_cfg=cfg, cache_root=cache, progress=False,
                          log=lambda s: None)
            save({"data": data, "name": method, "family": "frozentune", "accuracy": r["metrics"]["accuracy"],
                  "wall_seconds": time.perf_counter() - t0, "extract_seconds": r["extract_seconds"] or 0.0,
                  "train_seconds": r["train_seconds"], "trainable_params": r["trainable_params"],
                  "n_train": len(ds.train), **({"epochs": live_epochs[data]} if method == "prefix" else {})})
        for kind in ("lora", "peft-prefix") if "peft" in parts else ():
            name = kind + ("-bucketed" if a.bucketed else "")
            if (data, name) not in have:
                save({"data": data, "name": name, "family": "peft", "n_train": len(ds.train),
                      **train_peft(kind, ds, live_epochs[data], PEFT_LR[kind], seed=0, bucketed=a.bucketed)})
        for i, (lr, seed) in enumerate(PROBE_POINTS if "sweep" in parts else ()):
            name = f"probe-point-{i + 1}"
            if (data, name) not in have:
                t0 = time.perf_counter()
                r = api.train("probe", data, api.BackboneOptions(), train_cfg={"seed": seed, "lr": lr},
                              cache_root=cache, progress=False, log=lambda s: None)
                save({"data": data, "name": name, "family": "sweep", "lr": lr, "seed": seed,
                      "accuracy": r["metrics"]["accuracy"], "wall_seconds": time.perf_counter() - t0,
                      "extract_seconds": r["extract_seconds"] or 0.0, "train_seconds": r["train_seconds"]})
        if "sweep" in parts and data in a.second_lora.split(",") and (data, "lora-point-2") not in have:
            t0 = time.perf_counter()
            row = train_peft("lora", ds, live_epochs[data], 1e-3, seed=0)
            save({"data": data, "name": "lora-point-2", "family": "sweep", "n_train": len(ds.train),
                  "wall_seconds": time.perf_counter() - t0, **row})


def _joined(files: list[Path]) -> dict:
    """One results dict from several peers files (parts run as separate processes)."""
    ds = [json.loads(f.read_text()) for f in files]
    return {**ds[0], "command": "` + `".join(d["command"] for d in ds), "rows": [r for d in ds for r in d["rows"]]}


def report(d: dict, plot: Path) -> str:
    """The peers table, the marginal-cost table and the accuracy-vs-time plot."""
    rows = d["rows"]
    lines = [f"`{d['command']}` — {d['threads']} thread(s), {d['cpu']}; test accuracy (%), seed 0. "
             "frozentune's seconds: extraction of the head's layer (once per layer, paid by the first head on "
             "it) + training; PEFT's: training (scoring outside)", "",
             "| data | method | accuracy | trainable params | extraction s | training s | total s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    layer_cost: dict[tuple[str, str], float] = {}
    for r in rows:
        if r["family"] == "frozentune":
            layer = layer_of(r["name"])
            if r["extract_seconds"]:
                layer_cost[(r["data"], layer)] = r["extract_seconds"]
    order = [*HEADS, "prefix", "lora", "lora-bucketed", "peft-prefix", "peft-prefix-bucketed"]
    for r in sorted(rows, key=lambda r: (r["data"], order.index(r["name"]) if r["name"] in order else len(order))):
        if r["family"] == "sweep":
            continue
        ext = 0.0
        if r["family"] == "frozentune" and r["name"] != "prefix":
            ext = layer_cost.get((r["data"], layer_of(r["name"])), 0.0)
        shown = {"prefix": "encoder prefix (frozentune, live)", "lora": "PEFT LoRA", "peft-prefix": "PEFT prefix-tuning"}
        base = r["name"].removesuffix("-bucketed")
        what = (shown.get(base, base) + (", bucketed batches" if r["name"].endswith("-bucketed") else "")
                + (f" ({r['epochs']} ep)" if "epochs" in r else ""))
        lines.append(f"| {r['data']} | {what} | {r['accuracy']:.2f} | {r['trainable_params']:,} | "
                     f"{ext:,.0f} | {r['train_seconds']:,.0f} | {ext + r['train_seconds']:,.0f} |")
        data = r["data"]
        heads = [x for x in rows if x["data"] == data and x["family"] == "frozentune" and x["name"] in HEADS]
        if r["name"] == HEADS[-1] and len(heads) == len(HEADS):
            ext = sum(v for (d_, _), v in layer_cost.items() if d_ == data)
            train = sum(r["train_seconds"] for r in heads)
            lines.append(f"| {data} | all four heads in one run (one extraction per layer) | | | {ext:,.0f} | "
                         f"{train:,.0f} | {ext + train:,.0f} |")
    lines += ["", "Marginal cost of more points on the same data (wall seconds of each point on its own):", "",
              "| data | point | frozentune probe on the cache | PEFT LoRA |", "|---|---|---:|---:|"]
    for data in dict.fromkeys(r["data"] for r in rows):
        by = {r["name"]: r for r in rows if r["data"] == data}
        first = layer_cost.get((data, layer_of("probe")), 0.0) + by["probe"]["train_seconds"] if "probe" in by else None
        lora1 = by.get("lora", {}).get("train_seconds")
        lora2 = by.get("lora-point-2", {}).get("train_seconds")
        for i, label in ((0, "1st (includes extraction for frozentune)"), (2, "2nd"), (5, "5th")):
            fz = first if i == 0 else by.get(f"probe-point-{i}", {}).get("train_seconds")
            lo = lora1 if i == 0 else lora2 if i == 2 else None
            lines.append(f"| {data} | {label} | {'not run' if fz is None else f'{fz:,.1f}'} | "
                         f"{'not run' if lo is None else f'{lo:,.0f}'} |")
    _plot(rows, layer_cost, plot)
    lines += ["", f"Plot: {plot.name} (accuracy against seconds; PEFT runs as curves of their scored points)."]
    return "\n".join(lines)


def _plot(rows: list[dict], layer_cost: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    datas = list(dict.fromkeys(r["data"] for r in rows))
    fig, axes = plt.subplots(1, len(datas), figsize=(6.4 * len(datas), 5.6), squeeze=False)
    for ax, data in zip(axes[0], datas):
        for r in (r for r in rows if r["data"] == data and (r["family"] != "sweep" or "curve" in r)):
            if "curve" in r:
                c = np.array(r["curve"])
                kind = "lora" if r["name"].startswith("lora") else "prefix"
                colour = {"prefix": "tab:orange", "lora": "tab:blue" if r["lr"] < 1e-3 else "tab:cyan"}[kind]
                ax.plot(c[:, 1], c[:, 2], marker="o", color=colour,
                        linestyle="--" if r.get("batches") == "bucketed" else "-",
                        label=f"PEFT {kind}, lr {r['lr']:g}, {r.get('batches', 'shuffled')} batches")
            else:
                ext = 0.0 if r["name"] == "prefix" else layer_cost.get((data, layer_of(r["name"])), 0.0)
                x = ext + r["train_seconds"]
                ax.scatter([x], [r["accuracy"]], marker="s" if r["name"] == "prefix" else "D", zorder=3,
                           color="tab:purple" if r["name"] == "prefix" else "dimgray")
                ax.annotate(("encoder prefix" if r["name"] == "prefix" else r["name"]), (x, r["accuracy"]),
                            textcoords="offset points", xytext=(5, -10), fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("seconds on one thread (extraction + training; log scale)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{data}: frozentune (points) vs PEFT on MiniLM (curves)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
