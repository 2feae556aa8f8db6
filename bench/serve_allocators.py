"""The 1-head and the 8-head server on each memory allocator (`frozentune serve --allocator`), in one
run: peak resident memory and requests/s under 32 closed-loop clients, short texts (SST-2 test) then
long ones (IMDB slice, 128 tokens), each server loaded in turn, the order reversed every other repeat.

Servers: the heads of bench/serve_load.py (made there: `python bench/serve_load.py --only heads`),
torch on --threads threads, raw asyncio clients (serve_load.RawClients). Each server is started
once and takes every repeat of both text lengths, as in serve_load.py's heads table, so a peak is
the most that server held over the whole run. Allocators that are not installed are left out, and
the output says so.

  python bench/serve_allocators.py --output bench/results/serve_allocators.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import serve_load as sl

HERE = Path(__file__).resolve().parent
ALLOCATORS = ("system", "tcmalloc", "jemalloc")


async def measure(a) -> dict:
    import httpx

    from frozentune.serve import allocator

    heads = a.models / "heads"
    folders = [heads / n for n, _, _ in sl.HEADS]
    have = [x for x in a.allocators if x == "system" or allocator.find(x) is not None]
    logdir = Path(tempfile.mkdtemp(prefix="serve_allocators_"))
    servers = {(x, n): sl.Server(f"{x}-{n}", folders[:n], a.threads, logdir, extra=["--allocator", x])
               for x in have for n in (1, 8)}
    bodies = {"short": [json.dumps({"text": t}).encode() for t in sl.short_texts()],
              "long": [json.dumps({"text": t}).encode() for t in sl.long_texts()]}
    pool = sl.RawClients()
    runs: dict[tuple[str, int, str], list[dict]] = {}
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            for s in servers.values():
                await s.ready(client)
            seen = {s.name: s.models.get("allocator") for s in servers.values()}
            wrong = {k: v for k, v in seen.items() if v != k.rsplit("-", 1)[0]}
            if wrong:
                raise SystemExit(f"servers not on the allocator asked for: {wrong}")
            idle = {s.name: round(s.rss_mb(), 1) for s in servers.values()}
            for rep in range(a.repeats):
                for texts in ("short", "long"):
                    order = list(servers.items())
                    for (x, n), s in (order if rep % 2 == 0 else order[::-1]):
                        send = sl.classify_sender(pool, s.url, bodies[texts], n)
                        r = await sl.measured(client, [s], send, a.clients, a.requests, a.seconds,
                                              start_index=rep * a.requests)
                        runs.setdefault((x, n, texts), []).append(r)
                        sl.log(f"rep {rep + 1} {texts:5s} {s.name:11s} {r['requests_per_s']:7.1f} req/s  peak "
                               f"{r['peak_rss_total_mb']:.0f} MB  errors {r['errors']}")
            hwm = {s.name: s.hwm_mb() for s in servers.values()}
    finally:
        await pool.aclose()
        sl.stop_all()
    rows = []
    for x in have:
        row = {"allocator": x, "idle_mb": [idle[f"{x}-1"], idle[f"{x}-8"]],
               "peak_mb": [round(hwm[f"{x}-1"], 1), round(hwm[f"{x}-8"], 1)]}
        row["peak_8_over_1"] = round(row["peak_mb"][1] / row["peak_mb"][0], 3)
        for texts in ("short", "long"):
            one, eight = runs[(x, 1, texts)], runs[(x, 8, texts)]
            rps = [statistics.median(r["requests_per_s"] for r in rr) for rr in (one, eight)]
            row[texts] = {"requests_per_s": [round(v, 1) for v in rps], "eight_over_one": round(rps[1] / rps[0], 3),
                          "errors": sum(r["errors"] for r in one + eight),
                          "repeats": [[round(r["requests_per_s"], 1) for r in rr] for rr in (one, eight)]}
        rows.append(row)
    return {"allocators": rows, "left_out": [x for x in a.allocators if x not in have],
            "logs": str(logdir)}


def report(d: dict) -> str:
    base = next((r for r in d["allocators"] if r["allocator"] == "system"), None)
    lines = [f"`{d['command']}` ({d['when']}, {d['cpu']}, {d['threads']} torch thread(s) per server, "
             f"{d['clients']} clients, {d['repeats']} repeats, raw client)", "",
             "| allocator | idle MB, 1 / 8 heads | peak MB, 1 head | peak MB, 8 heads | peak 8 / 1 | short req/s, 1 / 8 heads "
             "| long req/s, 1 / 8 heads | 8 / 1 req/s, short / long | errors |",
             "|---|---|---:|---:|---:|---|---|---|---:|"]
    for r in d["allocators"]:
        lines.append(f"| {r['allocator']} | {r['idle_mb'][0]:.0f} / {r['idle_mb'][1]:.0f} | {r['peak_mb'][0]:.0f} | "
                     f"{r['peak_mb'][1]:.0f} | {r['peak_8_over_1']:.2f}× | "
                     f"{r['short']['requests_per_s'][0]:.1f} / {r['short']['requests_per_s'][1]:.1f} | "
                     f"{r['long']['requests_per_s'][0]:.1f} / {r['long']['requests_per_s'][1]:.1f} | "
                     f"{r['short']['eight_over_one']:.2f}× / {r['long']['eight_over_one']:.2f}× | "
                     f"{r['short']['errors'] + r['long']['errors']} |")
    if base:
        lines += ["", "Against the system's malloc, same run (peak memory; requests/s, median over repeats):", ""]
        for r in d["allocators"]:
            if r is base:
                continue
            peak = [r["peak_mb"][i] / base["peak_mb"][i] for i in (0, 1)]
            rps = {t: [r[t]["requests_per_s"][i] / base[t]["requests_per_s"][i] for i in (0, 1)] for t in ("short", "long")}
            lines.append(f"- {r['allocator']}: peak {peak[0]:.2f}× (1 head), {peak[1]:.2f}× (8 heads); requests/s short "
                         f"{rps['short'][0]:.2f}× / {rps['short'][1]:.2f}×, long {rps['long'][0]:.2f}× / {rps['long'][1]:.2f}×")
    if d["left_out"]:
        lines += ["", f"Not installed here, left out: {', '.join(d['left_out'])}."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", type=Path, default=HERE / "runs" / "serve-models")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "serve_allocators.json")
    a = ap.parse_args()
    a.allocators = [x.strip() for x in a.allocators.split(",")]
    if any(x not in ALLOCATORS for x in a.allocators) or min(a.repeats, a.requests, a.clients, a.threads) < 1:
        ap.error(f"--allocators from {', '.join(ALLOCATORS)}; --repeats, --requests, --clients, --threads ≥ 1")
    d = asyncio.run(measure(a))
    d |= {"command": "python bench/serve_allocators.py " + " ".join(sys.argv[1:]), "when": time.strftime("%Y-%m-%d %H:%M"),
          "cpu": sl.cpu_model(), "threads": a.threads, "clients": a.clients, "repeats": a.repeats}
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(d, indent=2))
    a.output.with_suffix(".md").write_text(report(d) + "\n")
    print(report(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
