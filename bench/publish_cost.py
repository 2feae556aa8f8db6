"""What publishing a cache entry costs with and without reading the shards' bytes back, side by side in
one process (rounds alternate the two): a build whose one process wrote every shard in order publishes
from the checksums its writer made (since e828f59); forcing ShardWriter.entry_sums to None makes it read
every byte back and checksum it twice, as every build did before.

The model is bench/cache_write_ab.py's (BERT built from config, 1 layer, 384 wide, 1 thread, fp32 pass,
fp16 states), the texts gpu_extract.py's seeded ones. Only _publish is timed (the merge, the links, the
small files, meta.json, the renames); the builds around it are the same.

    OMP_NUM_THREADS=1 python bench/publish_cost.py --texts 1500 --rounds 3 --out bench/results/publish_cost.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import torch

    import frozentune.cache as C
    import frozentune.extract.shards as S
    import gpu_extract as g
    from frozentune.backbone import Backbone

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="publish-cost-"))
    timed: list[float] = []
    real_publish, real_sums = C._publish, S.ShardWriter.entry_sums

    def publish(*args, **kw):
        t0 = time.perf_counter()
        try:
            return real_publish(*args, **kw)
        finally:
            timed.append(time.perf_counter() - t0)

    C._publish = publish
    out: dict = {"texts": a.texts, "rounds": a.rounds, "threads": torch.get_num_threads(), "seconds": {}}
    try:
        folder = g.build(dict(hidden_size=384, num_hidden_layers=1, num_attention_heads=12, intermediate_size=1536),
                         work / "m")
        bb = Backbone.load(str(folder), max_length=128, device=torch.device("cpu"), precision="fp32")
        data = g.texts(a.texts)
        for r in range(a.rounds):
            for mode in ("checksummed while written", "read back"):
                S.ShardWriter.entry_sums = real_sums if mode.startswith("checksummed") else (lambda self, sizes: None)
                g.cached(bb, data)
                out["seconds"].setdefault(mode, []).append(round(timed[-1], 4))
                print(f"round {r} {mode:26s} publish {timed[-1]:.3f} s", flush=True)
        n = int(bb.tokenize(data).lengths.sum())
        out["state_MB"] = round(n * bb.dim * 2 / 1e6, 1)
    finally:
        S.ShardWriter.entry_sums, C._publish = real_sums, real_publish
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in out["seconds"].items()}
    out["median_s"] = med
    out["read_back_over_checksummed"] = med["read back"] / med["checksummed while written"]
    print(json.dumps({k: out[k] for k in ("state_MB", "median_s", "read_back_over_checksummed")}))
    if a.out:
        out["command"] = "OMP_NUM_THREADS=1 python bench/publish_cost.py " + " ".join(sys.argv[1:])
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
