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

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNS = HERE / "runs"  # saved models (not committed)

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
    "ytuning": [
        ("ytuning-trec", ["--method", "ytuning", "--data", "trec"]),
        ("ytuning-sst5", ["--method", "ytuning", "--data", "sst5"]),
        ("ytuning-sst2", ["--method", "ytuning", "--data", "sst2"]),
        ("ytuning-imdb", ["--method", "ytuning", "--data", "imdb", "--max-length", "256"]),
    ] + [
        (f"ytuning-{data}-{tag}", ["--method", "ytuning", "--data", data, *opts])
        for data in ("sst5", "trec")
        for tag, opts in (("ce", ["--loss", "ce"]), ("random-init", ["--init", "random_vocab"]),
                          ("uniform-init", ["--init", "uniform"]), ("k2", ["--k", "2"]), ("k4", ["--k", "4"]),
                          ("L1", ["--layers", "1"]), ("L4", ["--layers", "4"]), ("D384", ["--dim", "0"]))
    ],
}


def machine() -> str:
    import torch
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def run_one(name: str, args: list[str]) -> dict:
    out = RUNS / name
    exe = str(Path(sys.executable).parent / "frozentune")
    cmd = [exe, "train", *args, "--output", str(out), "--quiet"]
    shown = "frozentune train " + " ".join(shlex.quote(a) for a in args)
    print(f"== {name}: {shown}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode})")
    result = json.loads((out / "result.json").read_text())
    result.update(name=name, command=shown, wall_seconds=time.perf_counter() - t0,
                  machine=machine(), date=time.strftime("%Y-%m-%d %H:%M"))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
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
        if "metrics" not in r or r.get("reference"):
            continue
        epochs = r.get("history") or []
        per_epoch = sum(h["epoch_seconds"] for h in epochs) / len(epochs) if epochs else None
        rows.append(f"| {r['name']} | {r['method']} | {r['data']} | {fmt(r['metrics']['accuracy'], 2)} | "
                    f"{fmt(r['metrics']['macro_f1'], 2)} | {fmt(r['trainable_params'])} | {100 * r['trainable_params'] / r['backbone_params']:.3g}% | {fmt(r['extract_seconds'])} | "
                    f"{fmt(r.get('cache_build_seconds'))} | {fmt(r['train_seconds'])} | {fmt(per_epoch, 2)} | {fmt(r['peak_rss_mb'], 0)} |")
        cmds.append(f"- `{r['name']}` ({r['date']}, {r['machine']}): `{r['command']}`" + (f" — {r['note']}" if r.get("note") else ""))
    text = "\n".join(rows) + "\n\nCommands (each run by `python bench/run.py SUITE`):\n" + "\n".join(cmds)
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


ABLATIONS = [("default (margin, label names, k=1, L=2, D=128)", ""), ("cross-entropy loss", "-ce"),
             ("random-vocabulary init", "-random-init"), ("uniform init", "-uniform-init"), ("k = 2", "-k2"),
             ("k = 4", "-k4"), ("L = 1", "-L1"), ("L = 4", "-L4"), ("D = 384 (backbone width)", "-D384"),
             ("cross-entropy, D = 384", "-ce-D384")]


def ablation_table() -> str:
    """Y-Tuning ablations on SST-5 and TREC: validation / test accuracy and trainable parameters."""
    rows = ["| configuration | SST-5 val | SST-5 test | TREC val | TREC test | trainable on TREC (share of backbone) |",
            "|---|---:|---:|---:|---:|---:|"]
    for label, suffix in ABLATIONS:
        cells, params = [], "–"
        for data in ("sst5", "trec"):
            p = RESULTS / f"ytuning-{data}{suffix}.json"
            if p.exists():
                r = json.loads(p.read_text())
                cells += [f"{r['validation']['accuracy']:.2f}", f"{r['metrics']['accuracy']:.2f}"]
                params = f"{r['trainable_params']:,} ({100 * r['trainable_params'] / r['backbone_params']:.2f}%)"
            else:
                cells += ["not run", "not run"]
        rows.append(f"| {label} | {' | '.join(cells)} | {params} |")
    return "\n".join(rows)


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
    text = _replace_block(text, "ytuning-ablation", ablation_table())
    report.write_text(text)
    print(f"wrote {report}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("suite", nargs="?", choices=sorted(SUITES))
    ap.add_argument("--only", help="comma-separated experiment names")
    ap.add_argument("--report", action="store_true", help="only rebuild REPORT.md")
    a = ap.parse_args()
    if a.suite and not a.report:
        only = set(a.only.split(",")) if a.only else None
        for name, args in SUITES[a.suite]:
            if only is None or name in only:
                run_one(name, args)
    write_report()


if __name__ == "__main__":
    main()
