"""Resume and sharding figures of the backbone pass (issue 16), through the CLI as users run it.

  python bench/cache_resume.py resume --reviews 2000 --kills 3     # SIGKILL a build 3 times, resume, compare
  python bench/cache_resume.py shards --reviews 1000               # 1×2 threads vs torchrun 2×1 vs --shard

Data: the first N reviews of IMDB's train file (../shared/data/imdb), written to a scratch folder
(bench/runs/, not committed), cached at --max-length 256 like the IMDB benchmarks. Every command
runs with an explicit thread count (OMP_NUM_THREADS), the default device (the CPU here) and the
default precision of this CPU unless --precision is given. Results: bench/results/cache_<mode>.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("states.bin", "ids.bin", "offsets.bin", "lengths.bin")


def slice_folder(n: int) -> Path:
    from frozentune.data import data_root

    out = HERE / "runs" / f"imdb{n}"
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "train.jsonl").exists():
        with open(data_root() / "imdb" / "train.jsonl") as f, open(out / "train.jsonl", "w") as g:
            for i, line in enumerate(f):
                if i >= n:
                    break
                g.write(line)
    return out


def cache_cmd(data: Path, root: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "frozentune.cli", "cache", str(data), "--splits", "train", "--max-length", "256",
            "--cache-dir", str(root), "--quiet", *extra]


def run(cmd: list[str], threads: int, env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(threads), **(env or {})),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0, p.stdout + p.stderr


def entry(root: Path) -> Path:
    found = [p for p in root.iterdir() if p.is_dir() and "." not in p.name]
    assert len(found) == 1, found
    return found[0]


def digests(path: Path) -> dict[str, str]:
    return {f: hashlib.blake2b((path / f).read_bytes(), digest_size=16).hexdigest() for f in FILES}


def resume(a) -> dict:
    data = slice_folder(a.reviews)
    extra = ["--precision", a.precision] if a.precision else []
    base = HERE / "runs" / "resume"
    for r in ("whole", "killed"):
        subprocess.run(["rm", "-rf", str(base / r)])
    whole_s, out = run(cache_cmd(data, base / "whole", extra), a.threads)
    print(out.strip(), flush=True)
    meta = json.loads((entry(base / "whole") / "meta.json").read_text())
    rng = random.Random(a.seed)
    kills = []
    root = base / "killed"
    startup = whole_s - meta["extract_seconds"]  # imports, model load, tokenising, merging
    left = meta["shards"]
    for k in range(a.kills):
        # a random point inside the extraction still to do (the build resumes, so each run has less)
        at = startup + rng.uniform(0.15, 0.85) * meta["extract_seconds"] * left / meta["shards"]
        started = time.time()
        proc = subprocess.Popen(cache_cmd(data, root, extra), env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(at)
        if proc.poll() is not None:
            raise SystemExit(f"kill {k}: the build finished before {at:.1f}s; use more reviews")
        proc.send_signal(signal.SIGKILL)  # a killed machine: no handler runs, nothing is cleaned up
        proc.wait()
        killed_at = time.time()
        building = next(root.glob("*.building"))
        shards = sorted(building.glob("shard-?????.json"))  # a finished shard's record
        # work lost: extraction time since the last shard this run finished (or since extraction began)
        mine = [p.stat().st_mtime for p in shards if p.stat().st_mtime >= started]
        lost = killed_at - (max(mine) if mine else started + startup)
        kills.append({"after_s": at, "finished_shards": len(shards), "finished_this_run": len(mine),
                      "lost_s": lost})
        left = meta["shards"] - len(shards)
        print(f"kill {k + 1}: after {at:.1f}s, {len(shards)} shards finished", flush=True)
    resumed_s, out = run(cache_cmd(data, root, extra), a.threads)
    print(out.strip(), flush=True)
    resumed_meta = json.loads((entry(root) / "meta.json").read_text())
    same = digests(entry(base / "whole")) == digests(entry(root))
    shard_s = meta["extract_seconds"] / meta["shards"]
    return {"command": " ".join(cache_cmd(data, Path("ROOT"), extra)), "threads": a.threads,
            "precision": meta["precision"], "reviews": a.reviews, "tokens": meta["tokens"],
            "shards": meta["shards"], "shard_tokens": meta["shard_tokens"], "shard_seconds_mean": shard_s,
            "uninterrupted_wall_s": whole_s, "kills": kills, "resume_wall_s": resumed_s,
            "byte_equal": same, "files": {f: resumed_meta["files"][f]["chunks"] == meta["files"][f]["chunks"]
                                          for f in FILES},
            "max_lost_s": max(k["lost_s"] for k in kills)}


def shards(a) -> dict:
    data = slice_folder(a.reviews)
    extra = ["--precision", a.precision] if a.precision else []
    base = HERE / "runs" / "shards"
    subprocess.run(["rm", "-rf", str(base)])
    rows = {}
    # startup (imports, model load, tokenising) is measured by a rerun that finds the entry cached
    plans = {
        "1 process x 1 thread": (cache_cmd(data, base / "p1t1", extra), 1),
        "1 process x 2 threads": (cache_cmd(data, base / "p1t2", extra), 2),
        "torchrun 2 processes x 1 thread": ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                             "--nproc-per-node", "2", *cache_cmd(data, base / "tr", extra)[1:]], 1),
    }
    for r in range(a.repeats):
        for name, (cmd, threads) in plans.items():
            root = Path(cmd[cmd.index("--cache-dir") + 1])
            subprocess.run(["rm", "-rf", str(root)])
            wall, _ = run(cmd, threads)
            again, _ = run(cmd, threads)  # cached: startup + verification only
            rows.setdefault(name, []).append({"wall_s": wall, "cached_rerun_s": again})
            print(f"round {r + 1} {name}: {wall:.1f}s (cached rerun {again:.1f}s)", flush=True)
    # --shard 0/2 and 1/2 as two independent processes, one thread each, run at the same time
    root = base / "split"
    cmds = [cache_cmd(data, root, [*extra, "--shard", f"{i}/2"]) for i in (0, 1)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in cmds]
    outs = [p.communicate() for p in procs]
    split_wall = time.perf_counter() - t0
    assert all(p.returncode == 0 for p in procs), outs
    meta = json.loads((entry(base / "p1t1") / "meta.json").read_text())
    ref = digests(entry(base / "p1t1"))
    equal = {"torchrun 2x1 == 1x1": digests(entry(base / "tr")) == ref,
             "--shard 0/2 + 1/2 == 1x1": digests(entry(root)) == ref,
             "1x2 threads == 1x1": digests(entry(base / "p1t2")) == ref}
    diff = max_abs_diff(entry(base / "p1t1"), entry(base / "p1t2"), meta["dim"])
    summary = {}
    for name, rs in rows.items():
        times = sorted(r["wall_s"] - r["cached_rerun_s"] for r in rs)
        med = times[len(times) // 2]
        summary[name] = {"extract_wall_s_median": med, "tokens_per_s": meta["tokens"] / med}
    base_rate = summary["1 process x 2 threads"]["tokens_per_s"]
    for s in summary.values():
        s["ratio_to_1x2"] = s["tokens_per_s"] / base_rate
    return {"reviews": a.reviews, "tokens": meta["tokens"], "precision": meta["precision"], "repeats": a.repeats,
            "rows": rows, "summary": summary, "split_two_processes_wall_s": split_wall, "equal": equal,
            "max_abs_diff_1x2_vs_1x1": diff,
            "commands": {k: " ".join(v[0]) for k, v in plans.items()} | {"split": [" ".join(c) for c in cmds]}}


def max_abs_diff(p: Path, q: Path, dim: int) -> float:
    import numpy as np

    a = np.fromfile(p / "states.bin", dtype=np.float16).astype(np.float32)
    b = np.fromfile(q / "states.bin", dtype=np.float16).astype(np.float32)
    return float(np.abs(a - b).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("resume", "shards"))
    ap.add_argument("--reviews", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--precision", default=None)
    a = ap.parse_args()
    result = resume(a) if a.mode == "resume" else shards(a)
    result["argv"] = " ".join(sys.argv)
    from frozentune.extract import cpu_features
    result["cpu"] = cpu_features()
    out = HERE / "results" / f"cache_{a.mode}.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "kills")}, indent=1))


if __name__ == "__main__":
    main()
