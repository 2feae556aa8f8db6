"""The 8-head server against the 1-head server (and, with --against, the 8-head server at an earlier
commit) in one run: short texts (SST-2 test), 32 closed-loop clients, the configurations interleaved
over --repeats repeats, so that the machine's drift reaches all of them alike; with --client both,
each server is loaded by httpx clients and by raw asyncio ones in every repeat.

Servers (each `frozentune serve` on a loopback port, torch on --threads threads, as in
bench/serve_load.py's heads part, from its model folder):
  1 head            this tree, probe-l4
  8 heads           this tree, the eight heads of serve_load.py
  8 heads at REV    the same eight heads, with the library's source as it was at --against REV
                    (`git archive REV src` unpacked to a temporary folder, first on the server's PYTHONPATH),
                    or as in the folder --against-src SRC (a src/ copied beside a tree without git: a GPU machine)
  1 head at REV     with --against-src, probe-l4 on that library too, so that each version has its own
                    8 heads / 1 head ratio

Reports each repeat's requests/s and the ratios 8 heads / 1 head, per repeat and mean ± std over the
repeats, and each server's peak RSS over the run.

  python bench/serve_heads_ab.py --against a91f5ed --output bench/results/serve_heads_ab.json
  python bench/serve_heads_ab.py --client both --output bench/results/serve_heads_clients.json
  python3 bench/serve_heads_ab.py --device cuda --client raw --against-src .gpu/old-src --against-name d50ea15 \
      --models .gpu/serve/models --output $OUT/serve_heads_ab_gpu.json        # on a GPU (bench/gpu_run.sh part serve-ab)
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import serve_load as sl  # noqa: E402


def source_at(rev: str, into: Path) -> Path:
    """The library's src/ folder as it was at rev, unpacked under `into`; its path (checked by imported_from)."""
    tar = subprocess.run(["git", "archive", rev, "src"], cwd=HERE.parent, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    return imported_from(into / "src", rev)


def imported_from(src: Path, rev: str) -> Path:
    """src, checked: a Python with that folder first on its PYTHONPATH imports frozentune from it (not from this
    tree)."""
    src = src.resolve()
    got = subprocess.run([sys.executable, "-c", "import frozentune; print(frozentune.__file__)"], check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(src)}).stdout.strip()
    if not Path(got).resolve().is_relative_to(src.resolve()):
        raise SystemExit(f"with PYTHONPATH={src}, frozentune came from {got}: the comparison would not run {rev}'s code")
    return src


async def measure(a, old_src: Path | None) -> dict:
    import httpx

    heads = a.models / "heads"
    folders = [heads / n for n, _, _ in sl.HEADS]
    logdir = Path(tempfile.mkdtemp(prefix="serve_heads_ab_"))
    specs = {"1 head": ([folders[0]], None), "8 heads": (folders, None)}
    if old_src is not None:
        if a.against_src:
            specs[f"1 head at {a.against}"] = ([folders[0]], old_src)
        specs[f"8 heads at {a.against}"] = (folders, old_src)
    servers = {}
    bodies = [json.dumps({"text": t}).encode() for t in sl.short_texts()]
    pool, raw = sl.Clients(), sl.RawClients()
    try:
        for name, (models, src) in specs.items():
            env = None if src is None else {
                "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
            servers[name] = sl.Server(name.replace(" ", "-"), models, a.threads, logdir, env=env)
        async with httpx.AsyncClient(trust_env=False) as client:
            for s in servers.values():
                await s.ready(client)
            for name in servers:
                sl.log(f"{name}: {'the library at ' + a.against if specs[name][1] is not None else 'this tree'}")
            runs: dict[str, list[dict]] = {}
            senders = {"httpx": lambda url, n: sl.classify_sender(pool, url, bodies, n),
                       "raw": lambda url, n: sl.classify_sender(raw, url, bodies, n)}
            kinds = ["httpx", "raw"] if a.client == "both" else [a.client]
            for kind in kinds:
                for name, s in servers.items():  # warm-up, not counted
                    await sl.closed_loop(senders[kind](s.url, len(specs[name][0])), a.clients, a.warm_requests,
                                         a.seconds, start_index=10**6)
            for rep in range(a.repeats):
                for kind in kinds:
                    for name, s in servers.items():
                        send = senders[kind](s.url, len(specs[name][0]))
                        r = await sl.measured(client, [s], send, a.clients, a.requests, a.seconds,
                                              start_index=rep * a.requests)
                        r.pop("latencies")
                        label = name if len(kinds) == 1 else f"{name}, {kind} client"
                        runs.setdefault(label, []).append(r)
                        sl.log(f"rep {rep + 1} {label:36s} {r['requests_per_s']:7.1f} req/s  p50 "
                               f"{r['latency_ms']['p50']} ms  rows/batch {r['rows_per_batch']}  client CPU "
                               f"{r['client_cpu_ms_per_request']} ms/request  errors {r['errors']}")
            hwm = {name: s.hwm_mb() for name, s in servers.items()}
    finally:
        await pool.aclose()
        await raw.aclose()
        sl.stop_all(list(servers.values()))
    ratios = {}
    for kind in kinds:
        suffix = "" if len(kinds) == 1 else f", {kind} client"
        for name in servers:
            if name.startswith("8 heads"):  # over the 1-head server of the same library where there is one
                base = name.replace("8 heads", "1 head") if name.replace("8 heads", "1 head") in servers else "1 head"
                one = [r["requests_per_s"] for r in runs[base + suffix]]
                ratios[f"{name} / {base}{suffix}"] = [r["requests_per_s"] / o for r, o in zip(runs[name + suffix], one)]
    return {"runs": runs, "peak_rss_mb": hwm,
            "ratios_per_repeat": {k: [round(x, 4) for x in v] for k, v in ratios.items()},
            "ratio_mean": {k: round(statistics.mean(v), 4) for k, v in ratios.items()},
            "ratio_std": {k: round(statistics.stdev(v), 4) if len(v) > 1 else None for k, v in ratios.items()}}


def report(d: dict) -> str:
    lines = [f"`{d['command']}` ({d['date']}; {d['cpu']}; {d['threads']} torch thread(s) per server, {d['clients']} "
             f"clients, short texts (SST-2 test), up to {d['requests']} requests or {d['seconds']} s per configuration "
             f"and repeat, {d['repeats']} repeats interleaved, {d['warm_requests']} warm-up requests each)", "",
             "| repeat | " + " | ".join(f"{n} requests/s" for n in d["runs"]) + " | "
             + " | ".join(d["ratios_per_repeat"]) + " |",
             "|---:|" + "---:|" * (len(d["runs"]) + len(d["ratios_per_repeat"]))]
    for i in range(d["repeats"]):
        lines.append(f"| {i + 1} | " + " | ".join(f"{d['runs'][n][i]['requests_per_s']:.1f}" for n in d["runs"]) + " | "
                     + " | ".join(f"{d['ratios_per_repeat'][n][i]:.3f}" for n in d["ratios_per_repeat"]) + " |")
    lines.append("| mean ± std | " + " | ".join("" for _ in d["runs"]) + " | "
                 + " | ".join(f"**{d['ratio_mean'][n]:.3f}** ± {d['ratio_std'][n] or 0:.3f}" for n in d["ratio_mean"]) + " |")
    lines += ["", "Client CPU per request (this process, median of the repeats): " + ", ".join(
        f"{n} {statistics.median(r['client_cpu_ms_per_request'] for r in rr):.2f} ms" for n, rr in d["runs"].items())]
    lines += ["", "Peak RSS over the run (VmHWM): " + ", ".join(f"{n} {v:,.0f} MB" for n, v in d["peak_rss_mb"].items() if v)]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="an earlier commit: a third server runs the eight heads with its library")
    ap.add_argument("--against-src", type=Path, default=None,
                    help="instead of --against: a folder holding an earlier src/ (frozentune inside it), for a tree "
                         "without git; two more servers run the 1 and 8 heads with that library")
    ap.add_argument("--against-name", default="the other library", help="with --against-src: what to call it")
    ap.add_argument("--device", default=None, help="every server's --device (e.g. cuda)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--warm-requests", type=int, default=640)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--client", choices=("httpx", "raw", "both"), default="httpx",
                    help="the load generator: httpx (serve_load.py's), raw (serve_load.RawClients: asyncio streams, "
                         "a fraction of httpx's CPU), or both, interleaved in every repeat")
    ap.add_argument("--models", type=Path, default=HERE / "runs" / "serve-models",
                    help="serve_load.py's model folder (its heads/ are made by `serve_load.py --only heads`)")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "serve_heads_ab.json")
    a = ap.parse_args()
    if not all((a.models / "heads" / n).is_dir() for n, _, _ in sl.HEADS):
        raise SystemExit(f"the eight heads are not in {a.models / 'heads'}: run `python bench/serve_load.py --only heads` once")
    if a.against and a.against_src:
        raise SystemExit("give --against REV or --against-src SRC, not both")
    sl.Server.common = ["--device", a.device] if a.device else []
    with tempfile.TemporaryDirectory(prefix="frozentune_at_") as tmp:
        if a.against_src:
            a.against = a.against_name
            old = imported_from(a.against_src, a.against_name)
        else:
            old = source_at(a.against, Path(tmp)) if a.against else None
        t0 = time.perf_counter()
        got = asyncio.run(measure(a, old))
    d = {"command": "python bench/serve_heads_ab.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M"),
         "cpu": sl.cpu_model(), "threads": a.threads, "clients": a.clients, "client": a.client, "requests": a.requests,
         "seconds": a.seconds, "repeats": a.repeats, "warm_requests": a.warm_requests,
         "wall_s": round(time.perf_counter() - t0, 1), **got}
    a.output.write_text(json.dumps(d, indent=2) + "\n")
    a.output.with_suffix(".md").write_text(report(d))
    print(report(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
