"""Run benchmark suites through the CLI and rebuild bench/REPORT.md.

  python bench/run.py foundation            # run every experiment of a suite
  python bench/run.py foundation --only probe-trec,probe-sst5
  python bench/run.py --report              # only rebuild the report from bench/results/*.json

Each experiment is one `frozentune train` process (so peak RSS is that run's own); its
result.json is copied to bench/results/NAME.json with the exact command and the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNS = HERE / "runs"  # saved models (not committed)

# Space Model ablation: (result-name tag, options) and the report rows (label, result-name suffix)
# (the ablation ran on the last layer, space's default layer until the layer sweep below)
SPACE_VARIANTS = [(tag, [*opts, "--layer", "-1"]) for tag, opts in [
    ("last", []), ("m3", ["--concept-dim", "3"]), ("m64", ["--concept-dim", "64"]),
    ("no-intra", ["--intra-weight", "0"]), ("no-inter", ["--inter-weight", "0"]),
    ("no-aux", ["--intra-weight", "0", "--inter-weight", "0"]), ("unmasked", ["--no-masked-mean"]),
    ("published", ["--concept-dim", "3", "--no-masked-mean"])]]
SPACE_ABLATIONS = [("last layer, m = 16, intra 1e-3, inter 1e-4, masked mean", "-last"), ("m = 3", "-m3"), ("m = 64", "-m64"),
                   ("without the intra-space loss", "-no-intra"), ("without the inter-space loss", "-no-inter"),
                   ("without either", "-no-aux"), ("unmasked mean (padding averaged in)", "-unmasked"),
                   ("as published: m = 3, unmasked mean", "-published")]



SEEDS = (0, 1, 2)

# issue 4: which hidden states the concept operators (and, for comparison, the probe) read.
# MiniLM has hidden states 0 (embeddings) … 6 (last layer); layer 6 is each method's
# last-layer run (probe-DATA, space-DATA-last). IMDB (an hour of extraction per layer on 2 cores)
# gets the chosen layer only, where the probe runs beside space's default.
SWEEP_LAYERS = (2, 3, 4, 5)
SPACE_LAYER = "-3"  # space's registered default: hidden state 4 of MiniLM's 0…6
SPACE_L4_VARIANTS = [("m3", ["--concept-dim", "3"]), ("m64", ["--concept-dim", "64"]),
                     ("no-intra", ["--intra-weight", "0"]), ("unmasked", ["--no-masked-mean"])]

# issue 6: prefix-tuning next to fine-tuning (all layers / top 2) on SmolLM2-135M; the prefix starts
# from the activations of "table-to-text:" (Li & Liang §7.4: word init helps most with little data).
# Learning rates: prefix 3e-4 and finetune 5e-5 are the methods' generation defaults; the top-2
# layers get 5e-4, chosen on validation loss in a pilot on the 100 pairs (bench/pilot/: 1.76 against
# 2.39 at epoch 3 for 5e-5, which had barely moved the two layers in 100 steps)
GEN_METHODS = {"prefix": ["--method", "prefix", "--init", "words"],
               "finetune": ["--method", "finetune"],
               "finetune-top2": ["--method", "finetune", "--top-layers", "2", "--lr", "5e-4"]}
# training budget per size: epochs (early stopping on validation loss, patience 2)
E2E_EPOCHS = {100: 8, 500: 3}


def e2e_lowdata(seeds: tuple[int, ...]) -> list[tuple[str, list[str]]]:
    """Low-data E2E (Li & Liang §6.3): N (mr, ref) pairs from e2e/dev, 100 validation pairs from dev
    sources outside them, greedy decoding of all 630 e2e/test MRs, BLEU with all references."""
    return [(f"gen-e2e{n}-{m}-s{seed}", [*opts, "--data", "e2e", "--num-beams", "1", "--max-train", str(n), "--max-validation", "100",
                                         "--epochs", str(E2E_EPOCHS[n]), "--seed", str(seed)])
            for seed in seeds for n in (100, 500) for m, opts in GEN_METHODS.items()]


def data_args(data: str) -> list[str]:
    """--data, and IMDB's longer max_length (its reviews average about 230 words)."""
    return ["--data", data, *(["--max-length", "256"] if data == "imdb" else [])]


def method_suite(method: str, ablation_data: tuple[str, ...],
                 variants: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """The method's defaults on the four classification sets (METHOD-DATA), then each variant
    (tag, options) on the ablation sets (METHOD-DATA-TAG)."""
    return ([(f"{method}-{d}", ["--method", method, *data_args(d)]) for d in ("trec", "sst5", "sst2", "imdb")]
            + [(f"{method}-{d}-{tag}", ["--method", method, *data_args(d), *opts])
               for d in ablation_data for tag, opts in variants])


SUITES: dict[str, list[tuple[str, list[str]]]] = {
    # issue 2: baselines on frozen MiniLM (defaults unless stated)
    "foundation": [
        ("probe-trec", ["--method", "probe", "--data", "trec"]),
        ("probe-sst5", ["--method", "probe", "--data", "sst5"]),
        ("probe-sst2", ["--method", "probe", "--data", "sst2"]),
        ("probe-sst2-10ep", ["--method", "probe", "--data", "sst2", "--epochs", "10", "--patience", "0"]),
        ("probe-imdb", ["--method", "probe", "--data", "imdb", "--max-length", "256"]),
        ("finetune-trec", ["--method", "finetune", "--data", "trec"]),
    ],
    # issue 3: Y-Tuning defaults on the four datasets, then the ablations on SST-5 and TREC
    "ytuning": method_suite("ytuning", ("sst5", "trec"), [
        ("margin", ["--loss", "margin"]), ("random-init", ["--init", "random_vocab"]),
        ("uniform-init", ["--init", "uniform"]), ("k2", ["--k", "2"]), ("k4", ["--k", "4"]),
        ("L1", ["--layers", "1"]), ("L4", ["--layers", "4"]), ("D384", ["--dim", "0"]),
        ("margin-D384", ["--loss", "margin", "--dim", "0"])])
    + [(f"ytuning-{d}-margin", ["--method", "ytuning", *data_args(d), "--loss", "margin"]) for d in ("sst2", "imdb")],
    # issue 4: the Space Model's defaults on the four datasets, then its ablations on all four
    "space": method_suite("space", ("sst2", "imdb", "trec", "sst5"), SPACE_VARIANTS),
    # issue 5: the span head frozen on three datasets, its ablation on SST-5, and unfrozen next to finetune
    "selfexplain": [
        ("selfexplain-sst5", ["--method", "selfexplain", "--data", "sst5"]),
        ("selfexplain-trec", ["--method", "selfexplain", "--data", "trec"]),
        ("selfexplain-sst2", ["--method", "selfexplain", "--data", "sst2"]),
        ("selfexplain-sst5-lam0", ["--method", "selfexplain", "--data", "sst5", "--reg-lambda", "0"]),
        ("selfexplain-sst5-lam1", ["--method", "selfexplain", "--data", "sst5", "--reg-lambda", "1"]),
        ("selfexplain-sst5-w3", ["--method", "selfexplain", "--data", "sst5", "--max-span-width", "3"]),
        ("selfexplain-sst5-w10", ["--method", "selfexplain", "--data", "sst5", "--max-span-width", "10"]),
        ("selfexplain-sst5-wall", ["--method", "selfexplain", "--data", "sst5", "--max-span-width", "0"]),
        ("finetune-sst5", ["--method", "finetune", "--data", "sst5"]),
        ("selfexplain-sst5-unfrozen", ["--method", "selfexplain", "--data", "sst5", "--train-backbone",
                                       "--lr", "5e-5", "--epochs", "3", "--batch-size", "32", "--patience", "2"]),
    ],
    # issue 4: how much one seed moves probe and space (seed 0 is each default run above); the
    # seed sets initialisation, batch order and the carved validation split. Space at its default
    # layer and at the last one, the probe at the last layer (its default) and at space's layer.
    "seeds": [(f"{m}-{d}{tag}-seed{seed}", ["--method", m, *data_args(d), *opts, "--seed", str(seed)])
              for d in ("trec", "sst5", "sst2", "imdb")
              for m, tag, opts in (("probe", "", []), ("space", "", []), ("space", "-last", ["--layer", "-1"]),
                                   ("probe", "-L4", ["--layer", SPACE_LAYER]))
              for seed in SEEDS[1:]],
    # issue 4: are the options chosen on the last layer still right on layer 4? (SST-2, TREC, SST-5)
    "space-l4-ablation": [(f"space-{d}-l4-{tag}", ["--method", "space", "--data", d, *opts])
                          for d in ("sst2", "trec", "sst5") for tag, opts in SPACE_L4_VARIANTS]
    # (and m = 3 on IMDB on layer 4, for the paper's Figure 1: a 3-D concept space per class)
    + [("space-imdb-l4-m3", ["--method", "space", *data_args("imdb"), "--concept-dim", "3"])],
    # issue 4: the layer sweep (validation picks space's default layer)
    "layers": [(f"{m}-{d}-L{k}", ["--method", m, "--data", d, "--layer", str(k)])
               for d in ("sst2", "trec", "sst5") for m in ("probe", "space") for k in SWEEP_LAYERS]
    + [(f"probe-{d}-L4", ["--method", "probe", *data_args(d), "--layer", SPACE_LAYER]) for d in ("imdb",)],
    # issue 6
    "e2e": e2e_lowdata((0,)),
    "e2e-seed1": e2e_lowdata((1,)),  # (this session ran its 100-pair half: --only gen-e2e100-*-s1)
    # WebNLG (§6.4): 400 training pairs, 300 test sources (a seeded sample: seen and unseen categories)
    "webnlg": [(f"gen-webnlg-{m}", [*opts, "--data", "webnlg", "--num-beams", "1", "--max-train", "400", "--max-validation", "100",
                                   "--max-test", "300", "--epochs", "3"])
               for m, opts in GEN_METHODS.items() if m != "finetune-top2"],
    # prefix-tuning of the frozen MiniLM encoder (a linear head on its mean-pooled states)
    # (SST-2 on a 10,000-example sample of train: the prefix runs MiniLM live, forward and backward,
    # every epoch; the probe on the same sample is the like-for-like frozen head)
    "encoder-prefix": [("prefix-trec", ["--method", "prefix", "--data", "trec"]),
                       ("prefix-sst2-10k", ["--method", "prefix", "--data", "sst2", "--max-train", "10000"]),
                       ("probe-sst2-10k", ["--method", "probe", "--data", "sst2", "--max-train", "10000"])],
}


def machine(threads: int | None = None) -> str:
    import torch
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{threads or torch.get_num_threads()} threads")


def write_result(out: Path, result: dict, md: str) -> None:
    """A single-purpose script's figures: out.json (the numbers, command, machine, date) and out.md
    (the table REPORT.md quotes), which is also printed."""
    out.parent.mkdir(exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(md)
    print(md)


def run_one(name: str, args: list[str], threads: int | None = None, concurrent: int = 1, note: str = "") -> dict:
    """One `frozentune train` process; with `threads`, torch in it uses that many (OMP_NUM_THREADS).
    With concurrent > 1 its output goes to runs/NAME.log instead of the terminal."""
    out = RUNS / name
    exe = str(Path(sys.executable).parent / "frozentune")
    cmd = [exe, "train", *args, "--output", str(out), "--quiet"]
    shown = "frozentune train " + " ".join(shlex.quote(a) for a in args)
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    print(f"== {name}: {shown}", flush=True)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    if concurrent > 1:
        with open(RUNS / f"{name}.log", "w") as log:
            proc = subprocess.run(cmd, text=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    else:
        proc = subprocess.run(cmd, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    result = json.loads((out / "result.json").read_text())
    result.update(name=name, command=shown, wall_seconds=time.perf_counter() - t0,
                  machine=machine(threads), date=time.strftime("%Y-%m-%d %H:%M"))
    if note:
        result["note"] = note
    if concurrent > 1:
        result["concurrency"] = (f"--jobs {concurrent}: up to {concurrent - 1} other experiment(s) ran at the same "
                                 f"time, {threads} torch thread(s) each")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    m = result["metrics"]
    print(f"   {name}: " + (f"BLEU {m['bleu']:.2f}" if "bleu" in m else f"test accuracy {m['accuracy']:.2f}"), flush=True)
    return result


def fmt(x, digits=1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}"


def results_table() -> str:
    rows = ["| experiment | method | data | accuracy | macro-F1 | trainable params | share of backbone | extract s (this run) | cache built in s | train s | s / epoch | peak RSS MB |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cmds = []
    for p in sorted(RESULTS.glob("*.json")):
        r = json.loads(p.read_text())
        if "metrics" not in r or r.get("reference") or r.get("name", "").startswith(("conv-", "gen-")):
            continue  # conv encoders and generation runs have their own tables
        epochs = r.get("history") or []
        per_epoch = sum(h["epoch_seconds"] for h in epochs) / len(epochs) if epochs else None
        rows.append(f"| {r['name']} | {r['method']} | {r['data']} | {fmt(r['metrics']['accuracy'], 2)} | "
                    f"{fmt(r['metrics']['macro_f1'], 2)} | {fmt(r['trainable_params'])} | {100 * r['trainable_params'] / r['backbone_params']:.3g}% | {fmt(r['extract_seconds'])} | "
                    f"{fmt(r.get('cache_build_seconds'))} | {fmt(r['train_seconds'])} | {fmt(per_epoch, 2)} | {fmt(r['peak_rss_mb'], 0)} |")
        cmds.append(f"- `{r['name']}` ({r['date']}, {r['machine']}): `{r['command']}`" + "".join(f" — {r[k]}" for k in ("concurrency", "note") if r.get(k)))
    text = "\n".join(rows) + ("\n\nCommands (each run by `python bench/run.py SUITE`), as they ran on their date: the "
                               "backbone pass was fp32 then, so a rerun on a CPU with native bf16 adds `--precision fp32`, "
                               "and TREC's and IMDB's carved validation splits have changed since (\"Figures recorded "
                               "before a later change\" at the top):\n") + "\n".join(cmds)
    refs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("sklearn-lr-*.json"))]
    if refs:
        text += ("\n\n**Reference**: scikit-learn logistic regression on the same mean-pooled cached states "
                 "and splits (`python bench/sklearn_reference.py trec sst5`)\n\n| data | accuracy | macro-F1 |\n|---|---:|---:|\n")
        text += "".join(f"| {r['data']} | {r['metrics']['accuracy']:.2f} | {r['metrics']['macro_f1']:.2f} |\n" for r in refs)
    ext = RESULTS / "extraction.json"
    if ext.exists():
        e = json.loads(ext.read_text())
        text += ("\n\n**Extraction speed** (`" + e["command"] + f"`, {e['date']}, {e['threads']} threads; median of "
                 "the repeats, interleaved in one process; tokens = real, non-padding tokens)\n\n"
                 "| slice | examples | mean tokens | bare loop tok/s | frozentune cache tok/s | cache / bare | padded-to-max tok/s | sorted dynamic padding speed-up |\n"
                 "|---|---:|---:|---:|---:|---:|---:|---:|\n")
        for r in e["runs"]:
            t = r["tokens_per_s"]
            text += (f"| {r['name']}, max_length {r['max_length']} | {r['examples']:,} | {r['mean_tokens']:.1f} | {t['bare']:,.0f} | "
                     f"{t['cache']:,.0f} | {100 * r['cache_vs_bare']:.1f}% | {t['padded']:,.0f} | {r['sorted_speedup_over_padded']:.2f}x |\n")
    pve = RESULTS / "probe-vs-extraction.json"
    if pve.exists():
        e = json.loads(pve.read_text())
        text += (f"\n**10 `probe` epochs vs the SST-2 extraction they replace**, side by side in one process (`{e['command']}`, {e['date']})\n\n"
                 "| repeat | extraction s (67,349 texts) | 10 probe epochs s | ratio |\n|---:|---:|---:|---:|\n")
        text += "".join(f"| {i + 1} | {r['extract_seconds']:.1f} | {r['train_seconds']:.1f} | {100 * r['ratio']:.1f}% |\n"
                        for i, r in enumerate(e["runs"]))
    return text


# (block name in REPORT.md) → (method, datasets, [(row label, result-name suffix)]); the first row is the default
ABLATIONS: dict[str, tuple[str, tuple[str, ...], list[tuple[str, str]]]] = {
    "ytuning-ablation": ("ytuning", ("sst5", "trec"), [
        ("default (cross-entropy, label names, k=1, L=2, D=128)", ""), ("margin loss (α = 1)", "-margin"),
        ("random-vocabulary init", "-random-init"), ("uniform init", "-uniform-init"), ("k = 2", "-k2"),
        ("k = 4", "-k4"), ("L = 1", "-L1"), ("L = 4", "-L4"), ("D = 384 (backbone width)", "-D384"),
        ("margin loss, D = 384", "-margin-D384")]),
    "space-ablation": ("space", ("sst2", "imdb", "trec", "sst5"), SPACE_ABLATIONS),
    "space-l4-ablation": ("space", ("sst2", "trec", "sst5"), [
        ("default (layer 4, m = 16, intra 1e-3, inter 1e-4, masked mean)", ""), ("m = 3", "-l4-m3"),
        ("m = 64", "-l4-m64"), ("without the intra-space loss", "-l4-no-intra"),
        ("unmasked mean (padding averaged in)", "-l4-unmasked")]),
    "selfexplain-ablation": ("selfexplain", ("sst5",), [
        ("default (λ = 0.1, max_span_width 5)", ""), ("λ = 0", "-lam0"), ("λ = 1", "-lam1"),
        ("max_span_width 3", "-w3"), ("max_span_width 10", "-w10"), ("all spans", "-wall")]),
}
# (block name) → (method, datasets, suffix of the probe run at the method's layer, or ""): the
# method's default runs next to the probe's
VERSUS_PROBE = {"ytuning-vs-probe": ("ytuning", ("trec", "sst5", "sst2", "imdb"), ""),
                "space-vs-probe": ("space", ("trec", "sst5", "sst2", "imdb"), "-L4"),
                "selfexplain-vs-probe": ("selfexplain", ("sst5", "sst2", "trec"), "")}


def _result(name: str) -> dict | None:
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _share(r: dict) -> str:
    return f"{r['trainable_params']:,} ({100 * r['trainable_params'] / r['backbone_params']:.2f}%)"


def ablation_table(method: str, datasets: tuple[str, ...], rows: list[tuple[str, str]]) -> str:
    """Validation / test accuracy per configuration and dataset, and trainable parameters."""
    head = " | ".join(f"{d} val | {d} test" for d in datasets)
    out = [f"| configuration | {head} | trainable (share of backbone), first dataset run |",
           "|---|" + "---:|" * (2 * len(datasets) + 1)]
    for label, suffix in rows:
        cells, params = [], "–"
        for data in datasets:
            r = _result(f"{method}-{data}{suffix}")
            if r:
                cells += [f"{r['validation']['accuracy']:.2f}", f"{r['metrics']['accuracy']:.2f}"]
                params = f"{_share(r)} on {data}" if params == "–" else params
            else:
                cells += ["not run", "not run"]
        out.append(f"| {label} | {' | '.join(cells)} | {params} |")
    return "\n".join(out)


def versus_probe_table(method: str, datasets: tuple[str, ...], same_layer: str = "") -> str:
    """The method's default run next to the probe's on each dataset: accuracy, gain, macro-F1,
    trainable parameters, seconds per epoch; with same_layer (a result-name suffix), also the
    probe reading the method's default layer (probe-DATA{same_layer}) and the gain over it."""
    extra = f" probe at {method}'s layer | gain there |" if same_layer else ""
    out = [f"| data | probe | {method} | gain |{extra} {method} macro-F1 | trainable (share of backbone) | s / epoch (see its note) |",
           "|---|---:|---:|---:|" + ("---:|---:|" if same_layer else "") + "---:|---:|---:|"]
    for data in datasets:
        probe, r = _result(f"probe-{data}"), _result(f"{method}-{data}")
        if not (probe and r):
            shown = f"{probe['metrics']['accuracy']:.2f}" if probe else "not run"
            out.append(f"| {data} | {shown} | not run | |" + (" | |" if same_layer else "") + " | | |")
            continue
        a, b = probe["metrics"]["accuracy"], r["metrics"]["accuracy"]
        cells = ""
        if same_layer:
            near = _result(f"probe-{data}{same_layer}")
            cells = (f" {near['metrics']['accuracy']:.2f} | {b - near['metrics']['accuracy']:+.2f} |" if near
                     else " not run | |")
        hist = r.get("history") or []
        per_epoch = sum(h["epoch_seconds"] for h in hist) / len(hist) if hist else None
        out.append(f"| {data} | {a:.2f} | {b:.2f} | {b - a:+.2f} |{cells} {r['metrics']['macro_f1']:.2f} | {_share(r)} | {fmt(per_epoch, 2)} |")
    return "\n".join(out)


def seeds_table(series: list[tuple[str, str]], datasets: tuple[str, ...],
                gains: list[tuple[int, int]]) -> str:
    """Test accuracy over the seeds (seed 0 = the run without -seedN) of each (label, result name
    with DATA in it) series, their means, and for each (a, b) in gains the mean of b − a over
    the seeds and how many seeds have b ≥ a."""
    out = ["| data | " + " | ".join(f"{label} per seed | mean" for label, _ in series) + " | "
           + " | ".join(f"{series[b][0]} − {series[a][0]}: mean (seeds ≥ 0)" for a, b in gains) + " |",
           "|---|" + "---|---:|" * len(series) + "---:|" * len(gains)]
    for data in datasets:
        runs = [[_result(name.replace("DATA", data) + (f"-seed{s}" if s else "")) for s in SEEDS] for _, name in series]
        if not all(r for rs in runs for r in rs):
            missing = [name.replace("DATA", data) for (_, name), rs in zip(series, runs) if not all(rs)]
            out.append(f"| {data} | not run: {', '.join(missing)} (`python bench/run.py seeds`) |")
            continue
        acc = [np.array([r["metrics"]["accuracy"] for r in rs]) for rs in runs]
        cells = [f"{' / '.join(f'{x:.2f}' for x in a)} | {a.mean():.2f}" for a in acc]
        cells += [f"{(acc[b] - acc[a]).mean():+.2f} ({int((acc[b] >= acc[a]).sum())} of {len(SEEDS)})" for a, b in gains]
        out.append(f"| {data} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def layer_sweep_table(datasets: tuple[str, ...]) -> str:
    """Validation / test accuracy of probe and space reading each MiniLM hidden state (seed 0)."""
    out = ["| data | layer | probe val | probe test | space val | space test | space − probe (test) |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for data in datasets:
        for k in (*SWEEP_LAYERS, 6):
            probe = _result(f"probe-{data}-L{k}" if k != 6 else f"probe-{data}")
            space = _result(f"space-{data}-L{k}" if k != 6 else f"space-{data}-last")
            if not (probe and space):
                out.append(f"| {data} | {k} | not run (`python bench/run.py layers`) | | | | |")
                continue
            pv, pt, sv, st = (r[f]["accuracy"] for r in (probe, space) for f in ("validation", "metrics"))
            out.append(f"| {data} | {k}{' (last)' if k == 6 else ''} | {pv:.2f} | {pt:.2f} | {sv:.2f} | {st:.2f} | {st - pt:+.2f} |")
    return "\n".join(out)


def _not_run(script: str) -> str:
    return f"not run (`python bench/{script}`)"


def span_cost_table() -> str:
    """One selfexplain epoch per span width at IMDB length (bench/span_cost.py)."""
    r = _result("span-cost")
    if not r:
        return _not_run("span_cost.py")
    out = [f"`{r['command']}` ({r['date']}, {r['threads']} threads): {r['examples']:,} IMDB reviews, max_length "
           f"{r['max_length']}, batch {r['batch_size']}, one epoch each in its own process",
           "", "| run | train examples | s / epoch | peak RSS MB | trainable params |", "|---|---:|---:|---:|---:|"]
    if r.get("note"):
        out.insert(1, f"({r['note']})")
    for x in r["runs"]:
        label = "probe (memory floor)" if "width" not in x else f"selfexplain, max_span_width {x['width']}"
        if x.get("failed") is not None:
            why = x.get("note") or f"exit {x['failed']}"
            out.append(f"| {label} | – | did not finish: {why} | – | – |")
        else:
            out.append(f"| {label} | {x['train_examples']:,} | {x['epoch_seconds']:.1f} | {x['peak_rss_mb']:,.0f} | "
                       f"{x['trainable_params']:,} |")
    return "\n".join(out)


def rationales_block() -> str:
    """Ten SST-2 test sentences with their top-3 spans (bench/rationales.py)."""
    r = _result("rationales-sst2")
    if not r:
        return _not_run("rationales.py")
    out = [f"`{r['command']}` ({r['date']}), model `{Path(r['model']).name}`", "",
           "| # | sentence | gold → predicted | top-3 spans (α) |", "|---:|---|---|---|"]
    for x in r["rows"]:
        spans = "; ".join(f"“{s['text']}” {s['weight']:.2f}" for s in x["spans"])
        out.append(f"| {x['index']} | {x['text']} | {x['gold']} → {x['predicted']} | {spans} |")
    return "\n".join(out)


def span_concentration_table() -> str:
    """Mean Σα², largest α and spans with weight on a test split (bench/span_concentration.py)."""
    r = _result("span-concentration-sst5")
    if not r:
        return _not_run("span_concentration.py")
    out = ["| model | λ | max_span_width | mean Σα² | mean largest α | spans with weight per example |",
           "|---|---:|---:|---:|---:|---:|"]
    out += [f"| {x['model']} | {x['reg_lambda']} | {x['max_span_width'] or 'all'} | {x['mean_sum_alpha_sq']:.3f} | "
            f"{x['mean_top_alpha']:.3f} | {x['mean_spans_with_weight']:.1f} |" for x in r["rows"]]
    return "\n".join(out)


def conv_table_block() -> str:
    """The four encoders × {scratch, pre-trained} (bench/conv_table.py)."""
    if not any(RESULTS.glob("conv-*-scratch.json")):
        return _not_run("conv_table.py")
    from conv_table import report
    return report("cpu")


def conv_pairs_block() -> str:
    """Each encoder from one pre-training budget on SST-2, SNLI and RTE (bench/conv_table.py)."""
    if not any(RESULTS.glob("conv-*-snli-*.json")):
        return _not_run("conv_table.py")
    from conv_table import pairs_report
    return pairs_report("cpu")


def peers_block() -> str:
    """frozentune's heads and encoder prefix beside PEFT LoRA / prefix-tuning (bench/peers.py); also draws peers.png."""
    files = sorted(RESULTS.glob("peers*.json"))
    if not files:
        return _not_run("peers.py")
    from peers import _joined, report
    return report(_joined(files), HERE / "peers.png")


def setfit_grid_block() -> str:
    """SetFit beside the best frozen head per (data, K) (bench/setfit_peer.py)."""
    if not (RESULTS / "setfit_peer.json").exists():
        return _not_run("setfit_peer.py")
    from setfit_peer import grid_report
    return grid_report()


def conv_speed_block() -> str:
    """Throughput and step memory against length (bench/conv_speed.py)."""
    r = _result("conv-speed")
    if not r:
        return _not_run("conv_speed.py")
    from conv_speed import table
    lengths = sorted({x["length"] for x in r["rows"]})
    ratios = "\n".join(f"| {L} | " + " | ".join(f"{v:.2f}x" for v in r["throughput_vs_transformer"][str(L)].values()) + " |"
                        for L in lengths)
    convs = list(r["throughput_vs_transformer"][str(lengths[0])])
    params = ", ".join(f"{a} {c['total']:,} ({c['non_embedding']:,} outside the embeddings)" for a, c in r["params"].items())
    return (f"`{r['command']}` ({r['date']}, {r['machine']}; {r['tokens_per_batch']:,} tokens per batch, median of "
            f"{r['repeats']} interleaved repeats; memory: {r['memory_method']})\n\nParameters: {params}\n\n"
            f"{table(r['rows'], lengths)}\n\nThroughput relative to the Transformer:\n\n| length | "
            + " | ".join(convs) + " |\n|---:|" + "---:|" * len(convs) + "\n" + ratios)


def _gen_cells(rs: list[dict]) -> str:
    """BLEU / chrF / ROUGE-L (mean over the seeds run, each seed's BLEU listed), sizes and times."""
    def mean(f) -> float:
        return float(np.mean([f(r) for r in rs]))
    bleus = " / ".join(f"{r['metrics']['bleu']:.2f}" for r in rs)
    r0 = rs[0]
    return (f"{mean(lambda r: r['metrics']['bleu']):.2f} ({bleus}) | {mean(lambda r: r['metrics']['chrf']):.2f} | "
            f"{mean(lambda r: r['metrics']['rouge_l']):.2f} | {r0['trainable_params']:,} | {r0['saved_params']:,} "
            f"({100 * r0['saved_params'] / r0['backbone_params']:.3f}%) | {mean(lambda r: r['train_seconds']):.0f} | "
            f"{mean(lambda r: r['decode_seconds']):.0f} | {mean(lambda r: r['best_epoch']):.1f} |")


def _gen_commands(rs: list[dict]) -> str:
    return "\n".join(f"- `{r['name']}` ({r['date']}, {r['machine']}): `{r['command']}`"
                     + "".join(f" — {r[k]}" for k in ("concurrency", "note") if r.get(k)) for r in rs)


def e2e_table() -> str:
    """Low-data E2E: each method and size, over the seeds that were run."""
    head = ("| pairs | method | BLEU (per seed) | chrF | ROUGE-L | trained params | saved params (of the LM) | "
            "train s | decode s (630 MRs) | best epoch |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows, used = [head], []
    for n in (100, 500):
        for m in GEN_METHODS:
            rs = [r for seed in SEEDS if (r := _result(f"gen-e2e{n}-{m}-s{seed}"))]
            if rs:
                rows.append(f"| {n} | {m} | " + _gen_cells(rs))
                used += rs
    if not used:
        return _not_run("run.py e2e")
    return "\n".join(rows) + "\n\nCommands (`python bench/run.py e2e`):\n" + _gen_commands(used)


def webnlg_table() -> str:
    rs = [r for m in GEN_METHODS if (r := _result(f"gen-webnlg-{m}"))]
    if not rs:
        return _not_run("run.py webnlg")
    rows = ["| method | BLEU all | BLEU seen | BLEU unseen | chrF seen | chrF unseen | ROUGE-L all | seen / unseen sources "
            "| train s | decode s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        g = r["metrics_by_group"]
        rows.append(f"| {r['method']} | {g['all']['bleu']:.2f} | {g['seen']['bleu']:.2f} | {g['unseen']['bleu']:.2f} | "
                    f"{g['seen']['chrf']:.2f} | {g['unseen']['chrf']:.2f} | {g['all']['rouge_l']:.2f} | "
                    f"{g['seen']['n']} / {g['unseen']['n']} | {r['train_seconds']:.0f} | {r['decode_seconds']:.0f} |")
    return "\n".join(rows) + "\n\nCommands (`python bench/run.py webnlg`):\n" + _gen_commands(rs)


def encoder_prefix_table() -> str:
    """Prefix-tuning of frozen MiniLM next to the frozen heads and fine-tuning on the same data."""
    rows = [("trec", "prefix-trec", ["probe-trec", "ytuning-trec", "space-trec", "selfexplain-trec", "finetune-trec"]),
            ("sst2 (10,000-example sample)", "prefix-sst2-10k", ["probe-sst2-10k"]),
            ("sst2 (all 60,953)", None, ["probe-sst2", "ytuning-sst2", "space-sst2", "selfexplain-sst2"])]
    out = ["| data | method | accuracy | macro-F1 | trainable params | train s | s / epoch |", "|---|---|---:|---:|---:|---:|---:|"]
    for data, pre, others in rows:
        for name in ([pre] if pre else []) + others:
            r = _result(name)
            if r is None:
                continue
            h = r.get("history") or []
            per = sum(x["epoch_seconds"] for x in h) / len(h) if h else float("nan")
            layer = r["config"]["backbone"]["layers"]
            label = r["method"] + (f" (hidden state {layer})" if layer != "-1" else "")
            out.append(f"| {data} | {'**' + label + '**' if name == pre else label} | "
                       f"{r['metrics']['accuracy']:.2f} | {r['metrics']['macro_f1']:.2f} | {r['trainable_params']:,} | "
                       f"{r['train_seconds']:.0f} | {per:.1f} |")
    return "\n".join(out) if len(out) > 2 else _not_run("run.py encoder-prefix")


def prefix_mixed_block() -> str:
    r = _result("prefix-mixed")
    if not r:
        return _not_run("prefix_mixed.py")
    from prefix_mixed import report
    return report(r)


def seq2seq_tiny_block() -> str:
    r = _result("seq2seq-tiny")
    if not r:
        return _not_run("seq2seq_tiny.py")
    from seq2seq_tiny import report
    return report(r)


def scitldr_block() -> str:
    r = _result("scitldr")
    if not r:
        return _not_run("scitldr.py")
    from scitldr import report
    return report(r)


def _replace_block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def write_report() -> None:
    """Replace the generated blocks between markers in REPORT.md; the prose around them is kept."""
    report = HERE / "REPORT.md"
    text = report.read_text() if report.exists() else "# Benchmarks\n\n<!-- results:start -->\n<!-- results:end -->\n"
    text = _replace_block(text, "results", results_table())
    for block, (method, datasets, rows) in ABLATIONS.items():
        text = _replace_block(text, block, ablation_table(method, datasets, rows))
    for block, (method, datasets, same_layer) in VERSUS_PROBE.items():
        text = _replace_block(text, block, versus_probe_table(method, datasets, same_layer))
    text = _replace_block(text, "space-seeds", seeds_table(
        [("probe (last layer)", "probe-DATA"), ("probe (layer 4)", "probe-DATA-L4"), ("space (layer 4)", "space-DATA"),
         ("space (last layer)", "space-DATA-last")], ("trec", "sst5", "sst2", "imdb"), [(0, 2), (1, 2), (0, 3)]))
    text = _replace_block(text, "space-layers", layer_sweep_table(("sst2", "trec", "sst5")))
    text = _replace_block(text, "span-cost", span_cost_table())
    text = _replace_block(text, "conv-table", conv_table_block())
    text = _replace_block(text, "conv-pairs", conv_pairs_block())
    text = _replace_block(text, "conv-speed", conv_speed_block())
    text = _replace_block(text, "span-concentration", span_concentration_table())
    text = _replace_block(text, "rationales", rationales_block())
    text = _replace_block(text, "e2e-lowdata", e2e_table())
    text = _replace_block(text, "webnlg", webnlg_table())
    text = _replace_block(text, "prefix-mixed", prefix_mixed_block())
    text = _replace_block(text, "seq2seq-tiny", seq2seq_tiny_block())
    text = _replace_block(text, "scitldr", scitldr_block())
    text = _replace_block(text, "encoder-prefix", encoder_prefix_table())
    text = _replace_block(text, "peers", peers_block())
    text = _replace_block(text, "setfit-grid", setfit_grid_block())
    report.write_text(text)
    print(f"wrote {report}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", nargs="?", choices=sorted(SUITES))
    ap.add_argument("--only", help="comma-separated experiment names")
    ap.add_argument("--jobs", type=int, default=1,
                    help="experiments run at once; each then gets cores/jobs torch threads (timings say so)")
    ap.add_argument("--threads", type=int, help="torch threads per experiment (default: cores / jobs)")
    ap.add_argument("--note", default="", help="a remark stored with each result (e.g. what else was running)")
    ap.add_argument("--report", action="store_true", help="only rebuild REPORT.md")
    a = ap.parse_args()
    if a.suite and not a.report:
        only = set(a.only.split(",")) if a.only else None
        todo = [(n, args) for n, args in SUITES[a.suite] if only is None or n in only]
        if only and (missing := only - {n for n, _ in todo}):
            raise SystemExit(f"not in suite {a.suite}: {', '.join(sorted(missing))}")
        if a.jobs > 1:
            from concurrent.futures import ThreadPoolExecutor

            threads = a.threads or max(1, (os.cpu_count() or 1) // a.jobs)
            with ThreadPoolExecutor(a.jobs) as pool:
                list(pool.map(lambda t: run_one(*t, threads=threads, concurrent=a.jobs, note=a.note), todo))
        else:
            for name, args in todo:
                run_one(name, args, threads=a.threads, note=a.note)
    write_report()


if __name__ == "__main__":
    main()
