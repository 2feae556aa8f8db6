"""An interrupted `frozentune sweep`, run again: the finished points reused, the table as an
uninterrupted sweep's, and the work an interrupt loses — through the CLI, as users run it.

  OMP_NUM_THREADS=1 python bench/sweep_resume.py --data trec --max-train 1000 --kills 2

Three runs of one sweep command on one cache (the cache built first, so every run trains from it):
  1. uninterrupted;
  2. the same command, interrupted with SIGINT (Ctrl-C) `--kills` times, each time once the journal
     holds a random number of new points (between 1 and the points left minus 1), then run to its end;
  3. the rows of 1 and 2 compared (setting, score, test accuracy: equal, or the difference said).
Reported: each run's wall time, the points each interrupted run had finished and how many the next
run reused, the seconds an interrupt lost (from the last journal line to the signal: the point in
progress), and the total time of run 2 against run 1 as a ratio. Results: bench/results/sweep_resume.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KEEP = ("method", "layer", "lr", "weight_decay", "seed", "score", "test_accuracy", "model_method")


def sweep_cmd(a: argparse.Namespace, root: Path, output: Path) -> list[str]:
    return [sys.executable, "-m", "frozentune.cli", "sweep", "--data", a.data, "--methods", a.methods,
            "--seeds", a.seeds, "--weight-decay", a.weight_decay, "--max-train", str(a.max_train),
            "--cache-dir", str(root), "--output", str(output), "--overwrite"]


def journal_lines(root: Path) -> int:
    """Finished points in the journals (their header lines not counted)."""
    return sum(sum(b'"key"' in line for line in p.read_bytes().splitlines()) for p in root.glob("sweep-*.points.jsonl"))


def run_to_end(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=7200)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0, p.stdout


def interrupted(cmd: list[str], env: dict, root: Path, new_points: int) -> dict:
    """Start the command, SIGINT it once the journal holds `new_points` more lines; what it kept and lost."""
    before = journal_lines(root)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last_line_at = None
    while journal_lines(root) < before + new_points:
        if p.poll() is not None:
            raise SystemExit(f"the sweep ended before {new_points} new points:\n{p.stderr.read()[-3000:]}")
        time.sleep(0.05)
    last_line_at = time.perf_counter()
    time.sleep(random.uniform(0.0, 1.0))  # the signal lands inside the next point, at a random place
    signalled = time.perf_counter()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    ended = time.perf_counter()
    reused = sum("reused" in line for line in out.splitlines() if line.startswith("["))
    return {"exit": p.returncode, "wall_s": ended - t0, "journal_points": journal_lines(root), "reused_at_start": reused,
            "lost_s": signalled - last_line_at, "stop_s": ended - signalled, "message": err.strip().splitlines()[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="trec")
    ap.add_argument("--methods", default="probe,space")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--weight-decay", default="0.01,0.1")
    ap.add_argument("--max-train", type=int, default=1000)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="where the interrupts land")
    a = ap.parse_args()
    random.seed(a.seed)
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    work = HERE / "runs" / "sweep_resume"
    root = work / "cache"
    root.mkdir(parents=True, exist_ok=True)
    for p in root.glob("sweep-*.points.jsonl"):
        p.unlink()
    n_points = len(a.methods.split(",")) * len(a.seeds.split(",")) * len(a.weight_decay.split(","))
    # the cache, built by a first sweep of one point (not timed against the others)
    subprocess.run(sweep_cmd(argparse.Namespace(**{**vars(a), "methods": "probe", "seeds": "0",
                                                   "weight_decay": "0.01"}), root, work / "warm"),
                   env=env, capture_output=True, check=True, timeout=7200)
    whole_s, _ = run_to_end(sweep_cmd(a, root, work / "whole"), env)
    cmd = sweep_cmd(a, root, work / "resumed")
    kills = []
    for _ in range(a.kills):
        left = n_points - journal_lines(root)
        if left < 3:
            break
        kills.append(interrupted(cmd, env, root, random.randint(1, left - 2)))
        print(f"interrupted: {kills[-1]}", flush=True)
    last_s, out = run_to_end(cmd, env)
    reused_last = sum("reused" in line for line in out.splitlines() if line.startswith("["))
    one = json.loads((work / "whole" / "sweep.json").read_text())["rows"]
    two = json.loads((work / "resumed" / "sweep.json").read_text())["rows"]
    same = [{k: r[k] for k in KEEP} for r in one] == [{k: r[k] for k in KEEP} for r in two]
    differ = [(i, {k: (r[k], s[k]) for k in KEEP if r[k] != s[k]}) for i, (r, s) in enumerate(zip(one, two))
              if any(r[k] != s[k] for k in KEEP)]
    resumed_total = sum(k["wall_s"] for k in kills) + last_s
    result = {"command": " ".join(cmd[2:]), "threads": int(threads), "points": n_points, "uninterrupted_s": whole_s,
              "interrupted_runs": kills, "last_run_s": last_s, "reused_by_last_run": reused_last,
              "resumed_total_s": resumed_total, "resumed_over_uninterrupted": resumed_total / whole_s,
              "rows_equal": same, "rows_differing": differ,
              "journal_left": sorted(p.name for p in root.glob("sweep-*.points.jsonl"))}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "sweep_resume.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "interrupted_runs"}, indent=1))


if __name__ == "__main__":
    main()
