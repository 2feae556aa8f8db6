"""What a cache build costs beyond the bare forward pass, for several versions of the library, side
by side (each version in its own process, versions interleaved in rounds).

  python bench/cache_write_ab.py --against f6867c8,278b818 --rounds 3 --out bench/results/cache_write_ab.json

Each version (a commit, checked out with `git worktree` into a temporary folder, or "here" for this
tree) builds the cache entry of the same seeded texts with a 1-layer, 384-wide BERT built from
config (so that the pass is short next to the writing, as on a GPU), 1 thread, fp32 pass, fp16
states, in a fresh folder, after a bare loop over the same batches. Reported per version: median
seconds of the bare loop and of the build, the overhead (build - bare) and bytes of states.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(texts: int) -> dict:
    import shutil

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    import gpu_extract as g
    from frozentune.backbone import Backbone

    work = Path(tempfile.mkdtemp(prefix="cache-ab-"))
    try:
        folder = g.build(dict(hidden_size=384, num_hidden_layers=1, num_attention_heads=12, intermediate_size=1536),
                         work / "m")
        bb = Backbone.load(str(folder), max_length=128, device=torch.device("cpu"), precision="fp32")
        data = g.texts(texts)
        tokens = bb.tokenize(data)
        g.bare(bb, tokens)
        bare = g.bare(bb, tokens)
        total, extract = g.cached(bb, data)
        n = int(tokens.lengths.sum())
        return {"bare": bare, "cache": total, "cache_extract": extract, "tokens": n, "state_MB": n * bb.dim * 2 / 1e6}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="", help="commits to compare with this tree, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--texts", type=int, default=1500)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.texts)))
        return
    repo = HERE.parent
    trees = {"here": repo / "src"}
    made = []
    for commit in filter(None, a.against.split(",")):
        wt = Path(tempfile.mkdtemp(prefix=f"ab-{commit}-"))
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(wt), commit], check=True)
        made.append(wt)
        trees[commit] = wt / "src"
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    try:
        for r in range(a.rounds):
            for name, src in trees.items():
                env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
                p = subprocess.run([sys.executable, __file__, "--child", "--texts", str(a.texts)], env=env,
                                   capture_output=True, text=True, check=True)
                runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(name, "round", r, runs[name][-1], flush=True)
    finally:
        for wt in made:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(wt)])
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    rows = {name: {"bare_s": med([x["bare"] for x in rs]), "cache_s": med([x["cache"] for x in rs]),
                   "overhead_s": med([x["cache"] - x["bare"] for x in rs]), "state_MB": rs[0]["state_MB"],
                   "tokens": rs[0]["tokens"]} for name, rs in runs.items()}
    for name, row in rows.items():
        print(f"{name}: bare {row['bare_s']:.2f} s, build {row['cache_s']:.2f} s, overhead {row['overhead_s']:.2f} s "
              f"({row['state_MB']:.0f} MB of states)")
    if a.out:
        a.out.write_text(json.dumps({"texts": a.texts, "rounds": a.rounds, "threads": 1, "rows": rows, "runs": runs},
                                    indent=1))


if __name__ == "__main__":
    main()
