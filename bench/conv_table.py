"""The shape of Table 2 of "Are Pre-trained Convolutions Better than Pre-trained Transformers?"
(Tay et al. 2021): four encoders (light, dynamic, dilated, transformer) × {no pre-training,
MLM pre-training for the same wall-clock budget} on SST-2, TREC and IMDB.

  python bench/conv_table.py                          # CPU scale (below), the whole grid
  python bench/conv_table.py --only light,trec        # runs whose name has every given part
  python bench/conv_table.py --pretrain-minutes 5 --threads 2
  python bench/conv_table.py --report                 # only print the table from bench/results
  python bench/conv_table.py --scale gpu              # full scale, on a CUDA GPU (see SCALES)
  python bench/conv_table.py --scale tiny             # smoke test of this script (results named *-tiny)

For each arch: `frozentune pretrain --corpus imdb --minutes M` (the IMDB train reviews; minutes of
training time, the tokenisation before it not counted) into bench/runs/conv-pretrain-ARCH[-gpu]
(resumed, so a finished run is not redone; --fresh starts it again), then per dataset
`frozentune train --method conv` from scratch and with --init that checkpoint.

CPU scale: 4 layers, width 256, 4 heads, kernel 7, FFN 1024 (10.7M parameters each, 2.9M outside
the embeddings), pre-trained at 256 tokens for 10 minutes each; SST-2 with 20,000 training texts,
3 epochs; TREC, 5 epochs; IMDB on a seeded, balanced slice (1,000 train / 1,000 test reviews)
truncated to 256 tokens, 3 epochs. On 2 cores it runs as two chains of one thread each, side by
side (`--only light --threads 1` then `--only dilated --threads 1`, beside the same for dynamic then
transformer), about 75 minutes in all; every pre-training then has one core to itself.
GPU scale: 12 layers, width 768, 12 heads, FFN 3072, 512 tokens, 4 hours of pre-training per arch,
the full datasets (IMDB at 512 tokens), --device cuda.

Results: bench/results/conv-pretrain-ARCH[-gpu].json and conv-ARCH-DATA-{scratch,pretrained}[-gpu].json
(with the command, machine and date, as bench/run.py records them).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run import RESULTS, RUNS, _result, machine, run_one  # noqa: E402  (bench/run.py: runs `frozentune train`, records results)

ARCHS = ("light", "dynamic", "dilated", "transformer")
DATASETS = ("sst2", "trec", "imdb", "snli", "rte")
PAIRS = ("snli", "rte")  # sentence pairs (issue 22): the paper expects convolutions to fall behind here
SCALES = {
    "cpu": {
        "encoder": ["--layers", "4", "--dim", "256", "--heads", "4", "--kernel-size", "7", "--ffn-dim", "1024"],
        "pretrain": ["--max-length", "256", "--batch-size", "32", "--lr", "5e-4", "--warmup-steps", "100",
                     "--checkpoint-every", "100", "--log-every", "20"],
        "minutes": 10.0,
        "imdb_slice": (1000, 1000),
        "train": [],
        "data": {"sst2": ["--data", "sst2", "--max-train", "20000", "--epochs", "3"],
                 "trec": ["--data", "trec", "--epochs", "5"],
                 "imdb": ["--data", "IMDB_SLICE", "--max-length", "256", "--epochs", "3"],
                 "snli": ["--data", "snli", "--epochs", "3"],
                 "rte": ["--data", "rte", "--epochs", "5"]},
    },
    "gpu": {
        "encoder": ["--layers", "12", "--dim", "768", "--heads", "12", "--kernel-size", "7", "--ffn-dim", "3072"],
        "pretrain": ["--max-length", "512", "--batch-size", "128", "--lr", "3e-4", "--warmup-steps", "2000",
                     "--checkpoint-every", "1000", "--log-every", "100", "--device", "cuda"],
        "minutes": 240.0,
        "train": ["--device", "cuda", "--lr", "1e-4", "--batch-size", "32"],
        "data": {"sst2": ["--data", "sst2", "--epochs", "3"],
                 "trec": ["--data", "trec", "--epochs", "10"],
                 "imdb": ["--data", "imdb", "--max-length", "512", "--epochs", "3"],
                 "snli": ["--data", "snli", "--epochs", "3"],
                 "rte": ["--data", "rte", "--epochs", "10"]},
    },
    "tiny": {  # a smoke test of this script (about 5 minutes on 2 cores), not a result
        "encoder": ["--layers", "1", "--dim", "32", "--heads", "2", "--kernel-size", "3", "--ffn-dim", "64"],
        "pretrain": ["--max-length", "64", "--batch-size", "8", "--warmup-steps", "5", "--log-every", "10"],
        "minutes": 0.1,
        "train": [],
        "data": {"sst2": ["--data", "sst2", "--max-length", "64", "--max-train", "300", "--epochs", "1"],
                 "trec": ["--data", "trec", "--max-length", "64", "--max-train", "300", "--epochs", "1"],
                 "imdb": ["--data", "IMDB_SLICE", "--max-length", "64", "--max-train", "300", "--epochs", "1"],
                 "snli": ["--data", "snli", "--max-length", "64", "--max-train", "300", "--epochs", "1"],
                 "rte": ["--data", "rte", "--max-length", "64", "--max-train", "300", "--epochs", "1"]},
    },
}


def imdb_slice(train: int = 2000, test: int = 1000, seed: int = 0) -> Path:
    """A folder with `train` IMDB train reviews and `test` IMDB test reviews, half of each label,
    seeded; written once under bench/runs/."""
    from frozentune.data import resolve

    folder = RUNS / f"imdb-conv-{train}-{test}"
    if (folder / "test.jsonl").exists():
        return folder
    _, files = resolve("imdb")
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        rows = [json.loads(line) for line in open(files[split], encoding="utf-8")]
        picked = []
        for label in ("negative", "positive"):
            picked += rng.sample([r for r in rows if r["label"] == label], n // 2)
        rng.shuffle(picked)
        tmp = folder / f".{split}.jsonl"
        tmp.write_text("".join(json.dumps({"text": r["text"], "label": r["label"]}) + "\n" for r in picked))
        tmp.rename(folder / f"{split}.jsonl")
    return folder


def suffix(scale: str) -> str:
    return "" if scale == "cpu" else f"-{scale}"


def shown_output(folder: str | Path) -> str:
    """A pre-training's --output as a command run from the repository root gives it: bench/runs/NAME for
    the folders this script uses (RUNS / NAME), else the path as recorded."""
    folder = Path(folder)
    return f"bench/runs/{folder.name}" if folder.parent.name == "runs" and folder.parent.parent.name == "bench" else str(folder)


def shown_command(r: dict) -> str:
    """A result's command; a pre-training recorded before its command named --output gets the folder its
    result records (conv_table.py always passed one)."""
    cmd = r["command"]
    if cmd.startswith("frozentune pretrain ") and "--output" not in cmd.split() and r.get("output"):
        cmd += " --output " + shlex.quote(shown_output(r["output"]))
    return cmd


def pretrain_one(arch: str, scale: str, minutes: float, threads: int | None, fresh: bool, note: str = "",
                 steps: int = 0) -> Path:
    """`frozentune pretrain` for one arch (resumed when its folder holds a run) with a budget of
    `steps` optimiser steps when given, else `minutes`; its result.json, the command, machine and
    date go to bench/results/conv-pretrain-ARCH.json."""
    s = SCALES[scale]
    name = f"conv-pretrain-{arch}{suffix(scale)}"
    out = RUNS / name
    if fresh and out.exists():
        shutil.rmtree(out)
    args = ["--arch", arch, "--corpus", "imdb", *s["encoder"], *s["pretrain"],
            *(["--steps", str(steps)] if steps else ["--minutes", str(minutes)])]
    resume = (out / "latest").is_file()
    before = json.loads((out / "result.json").read_text())["step"] if (out / "result.json").is_file() else None
    shown = "frozentune pretrain " + " ".join(shlex.quote(x) for x in [*args, "--output", shown_output(out)])
    print(f"== {name}: {shown}" + ("  (resuming)" if resume else ""), flush=True)
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    exe = str(Path(sys.executable).parent / "frozentune")
    t0 = time.perf_counter()
    proc = subprocess.run([exe, "pretrain", *args, "--output", str(out), *(["--resume"] if resume else [])], env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}); if its settings changed, rerun with --fresh")
    result = json.loads((out / "result.json").read_text())
    curve = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines() if line.strip()]
    every = max(1, len(curve) // 200)
    earlier = _result(name)
    idle = resume and before == result["step"]  # a resume that trained nothing
    if idle and earlier and earlier.get("checkpoint") == result["checkpoint"]:
        print(f"   {name}: already at its budget ({result['step']} steps); kept", flush=True)
        return out  # the recorded run stays as it was
    # the date of a pre-training is when its last checkpoint was written (fine-tunes after it use it)
    written = time.localtime(Path(result["checkpoint"]).stat().st_mtime)
    result.update(name=name, command=shown, wall_seconds=None if idle else time.perf_counter() - t0, machine=machine(threads),
                  date=time.strftime("%Y-%m-%d %H:%M", written),
                  loss_curve=curve[::every] + ([curve[-1]] if curve and (len(curve) - 1) % every else []))
    if note:
        result["note"] = note
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(f"   {name}: {result['step']} steps in {result['train_seconds'] / 60:.1f} min, MLM loss {result['final_loss']:.3f}", flush=True)
    return out


def finetune_runs(arch: str, scale: str, checkpoint: Path) -> list[tuple[str, list[str]]]:
    s = SCALES[scale]
    runs = []
    for data in DATASETS:
        data_args = [str(imdb_slice(*s.get("imdb_slice", (2000, 1000)))) if a == "IMDB_SLICE" else a
                     for a in s["data"][data]]
        base = ["--method", "conv", "--arch", arch, *s["encoder"], *data_args, *s["train"]]
        runs.append((f"conv-{arch}-{data}-scratch{suffix(scale)}", base))
        runs.append((f"conv-{arch}-{data}-pretrained{suffix(scale)}", [*base, "--init", str(checkpoint)]))
    return runs


def selected(name: str, only: list[str] | None) -> bool:
    """Whether run `name` (conv-ARCH-DATA-KIND or conv-pretrain-ARCH) has every part given in --only."""
    return only is None or name in only or all(part in name.split("-") for part in only)


TABLE = ("sst2", "trec", "imdb")  # the shape of the paper's Table 2


def stale(result: dict | None, pre: dict | None) -> bool:
    """A pre-trained fine-tune made before the current pre-training run (from an earlier checkpoint)."""
    return bool(result and pre and result.get("date", "") < pre.get("date", ""))


def report(scale: str) -> str:
    """Test accuracy per arch and dataset, without and with pre-training, and the gain."""
    sfx = suffix(scale)
    head = " | ".join(f"{d} scratch | {d} pre-trained | {d} gain" for d in TABLE)
    out = [f"| arch | parameters | pre-training (steps, MLM loss) | {head} | mean gain |",
           "|---|---:|---|" + "---:|" * (3 * len(TABLE) + 1)]
    marked = False
    for arch in ARCHS:
        pre = _result(f"conv-pretrain-{arch}{sfx}")
        cells, gains, params = [], [], "–"
        for data in TABLE:
            a, b = _result(f"conv-{arch}-{data}-scratch{sfx}"), _result(f"conv-{arch}-{data}-pretrained{sfx}")
            if a and params == "–":
                params = f"{a['trainable_params']:,}"
            mark = "†" if stale(b, pre) else ""
            marked |= bool(mark)
            cells += [f"{a['metrics']['accuracy']:.2f}" if a else "not run",
                      f"{b['metrics']['accuracy']:.2f}{mark}" if b else "not run"]
            if a and b:
                gains.append(b["metrics"]["accuracy"] - a["metrics"]["accuracy"])
                cells.append(f"{gains[-1]:+.2f}")
            else:
                cells.append("")
        pre_cell = (f"{pre['step']:,} steps in {pre['train_seconds'] / 60:.1f} min, {pre['final_loss']:.2f}" if pre else "not run")
        mean = f"{sum(gains) / len(gains):+.2f}" if gains else ""
        out.append(f"| {arch} | {params} | {pre_cell} | {' | '.join(cells)} | {mean} |")
    if marked:
        out.append("\n† fine-tuned from the earlier pre-training of the same arch and settings (a 10-minute budget, "
                   "163–172 steps, 2026-11-21), whose checkpoint was replaced by the one in the pre-training column.")
    names = [f"conv-pretrain-{arch}{sfx}" for arch in ARCHS] + [
        f"conv-{arch}-{data}-{kind}{sfx}" for arch in ARCHS for data in TABLE for kind in ("scratch", "pretrained")]
    cmds = [f"- `{r['name']}` ({r['date']}, {r['machine']}): `{shown_command(r)}`" for r in map(_result, names) if r]
    budgets = sorted({r["run"]["steps"] for r in map(_result, names[:len(ARCHS)]) if r and r.get("run", {}).get("steps")})
    by_steps = f"; the pre-trainings with `--pretrain-steps {', '.join(map(str, budgets))}`" if budgets else ""
    return ("\n".join(out) + "\n\nCommands (`python bench/conv_table.py" + (f" --scale {scale}" if sfx else "") + "`"
            + by_steps + "):\n" + "\n".join(cmds))


def pairs_report(scale: str = "cpu") -> str:
    """The pair claim: each encoder from the same pre-training budget on SST-2 (single sentences)
    and on SNLI and RTE (pairs), and its gap to the Transformer on each: does the gap open on pairs?"""
    sfx = suffix(scale)
    data = ("sst2", *PAIRS)
    acc = {(arch, d, kind): _result(f"conv-{arch}-{d}-{kind}{sfx}") for arch in ARCHS for d in data
           for kind in ("scratch", "pretrained")}

    def a(arch, d, kind="pretrained"):
        r = acc[(arch, d, kind)]
        return None if r is None or stale(r, _result(f"conv-pretrain-{arch}{sfx}")) else r["metrics"]["accuracy"]

    head = " | ".join(f"{d} pre-trained | {d} − transformer" for d in data)
    out = [f"| arch | pre-training | {head} | snli scratch | rte scratch |",
           "|---|---|" + "---:|" * (2 * len(data) + 2)]
    for arch in ARCHS:
        pre = _result(f"conv-pretrain-{arch}{sfx}")
        cells = []
        for d in data:
            x, t = a(arch, d), a("transformer", d)
            cells += ["not run" if x is None else f"{x:.2f}",
                      "" if x is None or t is None or arch == "transformer" else f"{x - t:+.2f}"]
        cells += ["not run" if a(arch, d, "scratch") is None else f"{a(arch, d, 'scratch'):.2f}" for d in PAIRS]
        pre_cell = f"{pre['step']} steps, MLM loss {pre['final_loss']:.2f}" if pre else "not run"
        out.append(f"| {arch} | {pre_cell} | {' | '.join(cells)} |")
    names = [f"conv-{arch}-{d}-{kind}{sfx}" for arch in ARCHS for d in data for kind in ("pretrained", "scratch")]
    cmds = [f"- `{r['name']}` ({r['date']}): `{shown_command(r)}`" for r in map(_result, names) if r]
    return "\n".join(out) + "\n\nCommands:\n" + "\n".join(cmds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    ap.add_argument("--pretrain-minutes", type=float, help="training minutes per arch (default: the scale's)")
    ap.add_argument("--pretrain-steps", type=int, default=0,
                    help="a budget in optimiser steps instead of minutes (the same for every arch whatever else "
                         "runs on the machine; 170 is what the 10-minute CPU runs reached)")
    ap.add_argument("--only", help="comma-separated run names, or parts of names (archs, datasets, scratch, "
                                   "pretrained, pretrain) that a run must all have")
    ap.add_argument("--threads", type=int, help="torch threads per run (OMP_NUM_THREADS)")
    ap.add_argument("--fresh", action="store_true", help="delete the selected pre-training runs and start them again")
    ap.add_argument("--report", action="store_true", help="only print the tables")
    ap.add_argument("--note", default="", help="a remark stored with each result (e.g. what ran beside it)")
    a = ap.parse_args()
    if not a.report:
        only = a.only.split(",") if a.only else None
        minutes = a.pretrain_minutes or SCALES[a.scale]["minutes"]
        names = [n for arch in ARCHS for n in (f"conv-pretrain-{arch}{suffix(a.scale)}",
                                               *(n for n, _ in finetune_runs(arch, a.scale, RUNS)))]
        if not any(selected(n, only) for n in names):
            raise SystemExit(f"no run matches --only {a.only}; runs are named like {names[0]} and {names[1]}")
        for arch in ARCHS:
            ckpt = RUNS / f"conv-pretrain-{arch}{suffix(a.scale)}"
            fine = [(n, args) for n, args in finetune_runs(arch, a.scale, ckpt) if selected(n, only)]
            needs_ckpt = any(n.endswith(f"pretrained{suffix(a.scale)}") for n, _ in fine)
            if selected(f"conv-pretrain-{arch}{suffix(a.scale)}", only) or needs_ckpt:
                pretrain_one(arch, a.scale, minutes, a.threads, a.fresh, a.note, a.pretrain_steps)
            for name, args in fine:
                run_one(name, args, threads=a.threads, note=a.note)
    print(report(a.scale))
    print()
    print(pairs_report(a.scale))


if __name__ == "__main__":
    main()
