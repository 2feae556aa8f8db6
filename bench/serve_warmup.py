"""Does a warm-up, or another allocator, stop the serving engine's memory from growing under varied
batches? In one process: the Engine with the 8 heads of serve_load.py (made there), an optional
warm-up of dummy batches, then 1,500 classify calls of 1-16 random SST-2 test texts (seeded), RSS
every 100. Prints one JSON line.

  mode: none | grid (rows 1-16 × every padded length 8-128) | short (rows 1-16 × lengths 8-72)
        | big (the largest batch the token budget allows at each length)

  OMP_NUM_THREADS=1 python bench/serve_warmup.py none > none.json
  LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 OMP_NUM_THREADS=1 python bench/serve_warmup.py none

Results (two at a time on the 2 cores, each pinned to 1 thread): bench/results/serve_warmup.jsonl.
"""
import sys, random, time, json
import psutil, torch
from serve_load import HEADS as SERVED, MODELS, short_texts
from frozentune.serve import Engine, ServeOptions
from frozentune.serve.batcher import Job
torch.set_num_threads(1)
mode = sys.argv[1]
HEADS = [n for n, _, _ in SERVED]
engine = Engine.load([MODELS / "heads" / n for n in HEADS], options=ServeOptions(pad_multiple=8), log=lambda m: None)
proc = psutil.Process(); rss = lambda: round(proc.memory_info().rss / 2**20, 1)
texts = short_texts()
r0 = rss(); t0 = time.perf_counter()
g = engine.groups[0]
tasks = [t.name for t in engine.tasks.values()]
def run(B, T):
    ids = [[101] + [1000] * (T - 2) + [102]] * B
    jobs = [Job(g, 8, T, {"ids": x, "tasks": tasks, "explain": None}) for x in ids]
    g.run(jobs)
if mode == "grid":
    for T in range(8, 129, 8):
        for B in range(1, 17):
            run(B, T)
elif mode == "big":
    for T in range(8, 129, 8):
        run(min(256, 8192 // T), T)
elif mode == "short":
    for T in range(8, 73, 8):
        for B in range(1, 17):
            run(B, T)
wt = time.perf_counter() - t0
r1 = rss()
rng = random.Random(0); series = []
t1 = time.perf_counter()
for i in range(1500):
    if i % 100 == 0: series.append(rss())
    engine.classify(rng.sample(texts, rng.randint(1, 16)))
series.append(rss())
print(json.dumps({"mode": mode, "rss_load": r0, "warm_s": round(wt,1), "rss_after_warm": r1, "series": series,
   "growth_from_warm_pct": round(100*(series[-1]-r1)/r1, 2), "loop_s": round(time.perf_counter()-t1,1)}))
engine.close()
