"""Servers of bench/serve_load.py's heads under variants of environment or options, side by side: peak
RSS (VmHWM) and requests/s, short texts then long ones, REPS repeats in alternating order, raw client,
1 torch thread each. The scratch script behind bench/REPORT.md's "The allocator under the server"
knob table and its self-explaining A/B, committed afterwards as it ran (it prints; it writes no file).

A variant is {"heads": [indices into serve_load.HEADS] (default: one 1-head and one 8-head server),
"env": {...}, "extra": [serve options]}. The runs in REPORT, e.g.:

  python bench/serve_memory_variants.py '{"default": {}, "mmap128k": {"env": {"MALLOC_MMAP_THRESHOLD_": "131072"}}}' 2
  python bench/serve_memory_variants.py '{"pad8": {}, "pad32": {"extra": ["--pad-multiple", "32"]}}' 3
  python bench/serve_memory_variants.py '{"one": {"heads": [0]}, "light": {"heads": [0,1,2,4,5,6]}, "eight": {"heads": [0,1,2,3,4,5,6,7]}, "se2": {"heads": [3,7]}}' 3
  python bench/serve_memory_variants.py '{"one": {"heads": [0]}, "new": {"heads": [0,1,2,3,4,5,6,7]}, "old": {"heads": [0,1,2,3,4,5,6,7], "env": {"PYTHONPATH": "OLD/src", "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}}}' 3

(The first knob runs used an earlier form that took {name: env} and always ran a 1- and an 8-head
server; the glibc malloc_trim rows needed a patched server and are not reproducible from this script.)
"""
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import httpx

import serve_load as sl

VARIANTS = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"default": {}}
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 2


def smaps(pid):
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = line.split(":", 1)
        if k in ("Rss", "Anonymous", "Private_Dirty"):
            out[k] = int(v.split()[0]) // 1024
    return out

async def main():
    heads = sl.MODELS / "heads"
    folders = [heads / n for n, _, _ in sl.HEADS]
    logdir = Path(tempfile.mkdtemp(prefix="memenv_"))
    servers = {}
    for v, spec in VARIANTS.items():
        idx = spec.get("heads"); env = spec.get("env", {}); extra = spec.get("extra", [])
        for n in ((1, 8) if idx is None else (len(idx),)):
            fs = folders[:n] if idx is None else [folders[i] for i in idx]
            servers[(v, len(fs))] = sl.Server(f"{v}-{len(fs)}", fs, 1, logdir, extra=extra, env=env)
    texts = {"short": sl.short_texts(), "long": sl.long_texts()}
    bodies = {k: [json.dumps({"text": t}).encode() for t in v] for k, v in texts.items()}
    pool = sl.RawClients()
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            for s in servers.values():
                await s.ready(client)
            print("idle", {s.name: round(s.rss_mb()) for s in servers.values()}, flush=True)
            res = {}
            for rep in range(REPS):
                for ts in ("short", "long"):
                    order = list(servers.items()) if rep % 2 == 0 else list(reversed(servers.items()))
                    for key, s in order:
                        send = sl.classify_sender(pool, s.url, bodies[ts], key[1])
                        r = await sl.measured(client, [s], send, 32, 3000, 12.0, start_index=rep * 3000)
                        res.setdefault(key, []).append((ts, r["requests_per_s"], r["peak_rss_total_mb"]))
                        print(rep, ts, s.name, f"{r['requests_per_s']:.1f} req/s peak {r['peak_rss_total_mb']:.0f} now {s.rss_mb():.0f}", smaps(s.proc.pid), flush=True)
            for key, s in servers.items():
                print(s.name, "hwm", s.hwm_mb(), smaps(s.proc.pid))
    finally:
        await pool.aclose()
        sl.stop_all()

if __name__ == "__main__":
    asyncio.run(main())
