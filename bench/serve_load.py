"""Load benchmark of `frozentune serve` over loopback (127.0.0.1): servers run as subprocesses
(`frozentune serve ... --port <free port>`, torch pinned to --threads), the client runs here
(asyncio + httpx.AsyncClient: one per simulated client and server, see Clients). Every request loop stops by itself: at --requests requests or
--seconds seconds per configuration, whichever comes first. Every server is stopped at the end,
also on an error or Ctrl-C.

Parts (--only, comma list; default all but soak):
  heads       requests/s, p50/p95/p99 latency and peak RSS of one server with 1, 4 and 8
              classification heads on MiniLM (probe, space, ytuning, selfexplain at layers 4 and -1,
              trained cheaply on an SST-2 sample), 32 clients, one text per request classified by
              every task; short texts (SST-2 test) and long ones (an IMDB test sample: the models read
              the first 128 tokens). The alternative: 8 one-head servers, each text sent to all 8.
              Beside them, the 6 heads other than the self-explaining ones in one server: what
              sharing the pass gives where every head is light.
  batching    the 1-head server with batching off (--batch-tokens 1: every batch one row) vs the
              default, 32 clients, short texts; and a plain Hugging Face loop (AutoModel, tokenizer,
              no_grad) over the same texts at batch 1, 8, 32 in this process (the ceiling).
  generation  8 prefixes on SmolLM2-135M in one server (the LM's own keys/values on 8 phrases,
              init=words: what `train --method prefix --init words` starts from, untrained):
              8 clients with 8 different prefixes vs 8 clients with one prefix vs one request at a
              time, and 16 clients on the 8 prefixes (the batch of bench/prefix_mixed.py); greedy, every row exactly --gen-new-tokens new tokens (min_new_tokens =
              max_new_tokens, so no mode gains from rows that stop early); tokens/s from the replies'
              "tokens".
  bad         malformed and out-of-range requests: status and message, /health after each.
  soak        --soak SECONDS at --soak-load × the 8-head capacity on short texts (read from the
              JSON's heads part, else measured first), open loop, after --soak-warm seconds of the
              same traffic: errors, latency, RSS idle / at the first request / start / end / max.
              The server inherits this process's environment (e.g. LD_PRELOAD=libjemalloc.so.2;
              the JSON records it).

Models are trained once into bench/runs/serve-models (git-ignored) and reused. Results: one JSON
(--output, default bench/results/serve_load.json; parts run again replace their own section) and
the markdown table beside it, which `--report` regenerates from the JSON alone.

  python bench/serve_load.py                                  # heads, batching, generation, bad (≈ 20 min on 2 cores,
                                                              # + ≈ 6 min the first time: training the heads, making the prefixes)
  python bench/serve_load.py --only soak --soak 600           # the soak, separately
  python bench/serve_load.py --requests 64 --seconds 10 --gen-requests 16 --repeats 1 --output bench/runs/serve_smoke.json
  python bench/serve_load.py --report                         # rewrite the .md from the .json
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = HERE / "runs" / "serve-models"
EXE = Path(sys.executable).parent / "frozentune"


def ft() -> list[str]:
    """The frozentune command: the installed script, else `python -m frozentune` (a machine where the
    package is only on PYTHONPATH, as bench/gpu_run.sh sets it up)."""
    return [str(EXE)] if EXE.is_file() else [sys.executable, "-m", "frozentune"]


PARTS = ("heads", "batching", "generation", "bad", "soak")

# name, method, layer: four methods × two layers; the first n are the n-head server
HEADS = [("probe-l4", "probe", 4), ("space-l4", "space", 4), ("ytuning-l4", "ytuning", 4),
         ("selfexplain-l4", "selfexplain", 4), ("probe-last", "probe", -1), ("space-last", "space", -1),
         ("ytuning-last", "ytuning", -1), ("selfexplain-last", "selfexplain", -1)]
LIGHT = [h for h in HEADS if h[1] != "selfexplain"]  # the heads whose compute is a few % of the pass
TRAIN_ARGS = ["--data", "sst2", "--backbone", "minilm", "--max-train", "1500", "--epochs", "2", "--seed", "0"]
PHRASES = ["table-to-text:", "summarize the following", "describe the restaurant", "write a review",
           "translate to French", "answer the question", "restaurant description:", "data to text"]
JSON_HEADERS = {"content-type": "application/json"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    import platform
    return platform.processor() or platform.machine()


def percentiles(values: list[float]) -> dict:
    import numpy as np
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(np.asarray(values) * 1000.0, [50, 95, 99])
    return {"p50": round(float(p[0]), 2), "p95": round(float(p[1]), 2), "p99": round(float(p[2]), 2)}


# ----------------------------------------------------------------------------- servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # Linux: the server gets SIGTERM if this process dies without cleaning up
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Server:
    """`frozentune serve` as a subprocess on a free loopback port; output to a log file."""
    running: list["Server"] = []
    exit_codes: dict[str, int | None] = {}  # of the servers stopped since the part began
    common: list[str] = []  # options every server gets (--device)

    def __init__(self, name: str, models: list[Path], threads: int, logdir: Path, extra: list[str] = (),
                 env: dict[str, str] | None = None):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [*ft(), "serve", *map(str, models), "--host", "127.0.0.1", "--port", str(self.port), *extra,
                    *Server.common]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self._terminated = False
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        Server.running.append(self)
        import psutil
        self.ps = psutil.Process(self.proc.pid)
        self.models: dict = {}
        self.threads_seen: int | None = None

    def shown(self) -> str:
        cmd = ["frozentune", *self.cmd[3:]] if self.cmd[1:3] == ["-m", "frozentune"] else self.cmd
        return " ".join(shlex.quote(Path(c).name if i == 0 else c) for i, c in enumerate(cmd))

    def tail(self, n: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    async def ready(self, client, timeout: float = 300.0) -> None:
        import httpx
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited ({self.proc.returncode}) before answering /health:\n{self.tail()}")
            with contextlib.suppress(httpx.TransportError):
                r = await client.get(self.url + "/health", timeout=2.0)
                if r.status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {self.name} did not answer /health in {timeout:.0f}s:\n{self.tail()}")
            await asyncio.sleep(0.25)
        self.models = (await client.get(self.url + "/v1/models")).json()
        m = re.search(r"(\d+) torch thread\(s\)", self.log_path.read_text(errors="replace"))
        self.threads_seen = int(m.group(1)) if m else None

    def rss_mb(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def hwm_mb(self) -> float | None:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return None

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds of the main thread (uvicorn's event loop: HTTP, JSON, validation, tokenising)
        and of every other thread (the batcher: model pass, heads, building each row's answer)."""
        main = other = 0.0
        for t in self.ps.threads():
            if t.id == self.proc.pid:
                main += t.user_time + t.system_time
            else:
                other += t.user_time + t.system_time
        return main, other

    def terminate(self) -> None:
        """SIGTERM once (a second one would cut uvicorn's graceful shutdown short)."""
        if self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.terminate()

    def stop(self) -> None:
        self.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        Server.exit_codes[self.name] = self.proc.returncode
        self._log.close()
        if self in Server.running:
            Server.running.remove(self)

    def describe(self) -> dict:
        groups = self.models.get("groups", [])
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        return {"command": self.shown(), "tasks": [t["name"] for t in self.models.get("tasks", [])],
                "groups": groups, "batching": self.models.get("batching"), "torch_threads": self.threads_seen,
                "allocator": self.models.get("allocator"),
                "log_tracebacks": text.count("Traceback"), "log_http_500": len(re.findall(r'" 500 ', text))}


def stop_all(servers: list[Server] | None = None) -> None:
    for s in list(Server.running if servers is None else servers):
        s.terminate()
    for s in list(Server.running if servers is None else servers):
        s.stop()


async def start(client, specs: list[tuple[str, list[Path], list[str]]], threads: int, logdir: Path) -> list[Server]:
    """Start the servers together, then wait for each one's /health."""
    servers = [Server(name, models, threads, logdir, extra) for name, models, extra in specs]
    t0 = time.perf_counter()
    try:
        for s in servers:
            await s.ready(client)
    except BaseException:
        stop_all(servers)
        raise
    log(f"started {', '.join(s.name for s in servers)} in {time.perf_counter() - t0:.1f}s")
    return servers


class Clients:
    """One httpx.AsyncClient (one keep-alive connection) per worker and server. httpx's pool costs
    grow with its size: 32 workers sharing one client used 5.9 ms of this process's CPU per classify
    request here, one client each 1.3 ms (and the server got twice the requests/s), on 2 cores that
    the client shares with the server."""

    def __init__(self) -> None:
        self._c: dict = {}

    def __call__(self, worker: int, server: int = 0):
        import httpx
        c = self._c.get((worker, server))
        if c is None:
            c = self._c[(worker, server)] = httpx.AsyncClient(
                # idle connections dropped here before uvicorn drops them (its keep-alive is 5 s): no
                # request is ever sent on a connection the server is closing
                limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=2.0),
                timeout=httpx.Timeout(120.0),
                trust_env=False)
        return c

    async def aclose(self) -> None:
        for c in self._c.values():
            await c.aclose()
        self._c.clear()


class RawClients:
    """One keep-alive HTTP/1.1 connection per worker and server on asyncio streams, with the request's
    bytes made once: a load generator that takes little of the 2 cores it shares with the servers
    (httpx took 0.76-0.89 ms of CPU per classify request here). Each answer is read whole (status
    line, headers, Content-Length bytes) and its JSON parsed; a connection the server closed is
    opened again. Plain HTTP/1.1 with Content-Length only: enough for `frozentune serve`."""

    def __init__(self) -> None:
        self._c: dict = {}

    async def post(self, worker: int, url: str, path: str, body: bytes) -> tuple[int, bytes]:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        key = (worker, url)
        head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for attempt in (0, 1):
            conn = self._c.get(key)
            if conn is None:
                conn = self._c[key] = await asyncio.open_connection(host, int(port))
            reader, writer = conn
            try:
                writer.write(head + body)
                status_line = await reader.readuntil(b"\r\n")
                if not status_line:
                    raise ConnectionResetError("closed")
                length, close = 0, False
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                payload = await reader.readexactly(length)
                if close:
                    self._drop(key)
                return int(status_line.split(b" ", 2)[1]), payload
            except (ConnectionError, asyncio.IncompleteReadError):
                self._drop(key)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _drop(self, key) -> None:
        conn = self._c.pop(key, None)
        if conn is not None:
            conn[1].close()

    async def aclose(self) -> None:
        for key in list(self._c):
            self._drop(key)


def client_pool(kind: str) -> "Clients | RawClients":
    """The load generator's connections: httpx (Clients) or raw asyncio streams (RawClients); --client."""
    return RawClients() if kind == "raw" else Clients()


async def post_classify(pool: "Clients | RawClients", worker: int, server: int, url: str, body: bytes) -> tuple[int, bytes]:
    """POST body to url's /v1/classify on the worker's own connection to that server: (status, body)."""
    if isinstance(pool, RawClients):
        return await pool.post(worker, url, "/v1/classify", body)
    r = await pool(worker, server).post(url + "/v1/classify", content=body, headers=JSON_HEADERS)
    return r.status_code, r.content


def parse_metrics(text: str) -> dict:
    """Sums over groups of the batch histograms in /metrics."""
    out = {"rows_sum": 0.0, "batches": 0.0, "batch_seconds": 0.0}
    for line in text.splitlines():
        if line.startswith("frozentune_batch_rows_sum"):
            out["rows_sum"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("frozentune_batch_rows_count"):
            out["batches"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("frozentune_batch_seconds_sum"):
            out["batch_seconds"] += float(line.rsplit(" ", 1)[1])
    return out


# ----------------------------------------------------------------------------- measuring
class Sampler:
    """Resident memory of the servers every `every` seconds while a load runs: peak per server and
    peak of their sum; optionally a coarse time series."""

    def __init__(self, servers: list[Server], every: float = 0.1, series_every: float | None = None):
        self.servers, self.every, self.series_every = servers, every, series_every
        self.peak = {s.name: 0.0 for s in servers}
        self.peak_total = 0.0
        self.first: float | None = None
        self.last = 0.0
        self.series: list[tuple[float, float]] = []
        self._task: asyncio.Task | None = None

    def sample(self) -> float:
        total = 0.0
        for s in self.servers:
            with contextlib.suppress(Exception):
                r = s.rss_mb()
                self.peak[s.name] = max(self.peak[s.name], r)
                total += r
        self.peak_total = max(self.peak_total, total)
        if self.first is None:
            self.first = total
        self.last = total
        return total

    async def _run(self) -> None:
        t0 = next_series = time.perf_counter()
        while True:
            total = self.sample()
            if self.series_every and time.perf_counter() >= next_series:
                self.series.append((round(time.perf_counter() - t0, 1), round(total, 1)))
                next_series += self.series_every
            await asyncio.sleep(self.every)

    def __enter__(self) -> "Sampler":
        self.sample()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        self._task.cancel()
        self.sample()


async def closed_loop(send: Callable[[int, int], Awaitable[tuple[bool, dict]]], clients: int, n: int, seconds: float,
                      start_index: int = 0) -> dict:
    """`clients` workers each send one request after another (request i from worker k: send(i, k)) until n requests
    were started or `seconds` passed; latency per request, errors by kind."""
    state = {"next": 0}
    lat: list[float] = []
    errors: Counter = Counter()
    extras: Counter = Counter()
    deadline = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        while state["next"] < n and time.perf_counter() < deadline:
            i = state["next"]
            state["next"] += 1
            t = time.perf_counter()
            try:
                ok, info = await send(start_index + i, k)
            except Exception as e:  # a transport error is an error of this request, the loop goes on
                ok, info = False, {"error": type(e).__name__}
            if ok:
                lat.append(time.perf_counter() - t)
                extras.update({k2: v for k2, v in info.items() if isinstance(v, (int, float))})
            else:
                errors[str(info.get("error", "?"))[:80]] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "started": state["next"], "errors": sum(errors.values()),
            "error_kinds": dict(errors), "wall_s": round(wall, 3), "requests_per_s": len(lat) / wall if wall else 0.0,
            "latency_ms": percentiles(lat), "latencies": lat, "sums": dict(extras)}


async def measured(client, servers: list[Server], send, clients: int, n: int, seconds: float, start_index: int = 0,
                   sampler_every: float = 0.1) -> dict:
    """closed_loop plus the servers' peak RSS, CPU seconds, batch statistics and this process's CPU."""
    import psutil
    me = psutil.Process()
    before = {s.name: parse_metrics((await client.get(s.url + "/metrics")).text) for s in servers}
    cpu0 = {s.name: s.cpu_s() for s in servers}
    split0 = {s.name: s.cpu_split() for s in servers}
    mine0 = sum(me.cpu_times()[:2])
    with Sampler(servers, sampler_every) as smp:
        r = await closed_loop(send, clients, n, seconds, start_index)
    mine = sum(me.cpu_times()[:2]) - mine0
    cpu = sum(s.cpu_s() - cpu0[s.name] for s in servers)
    split = {s.name: s.cpu_split() for s in servers}
    loop_cpu = sum(split[k][0] - split0[k][0] for k in split)
    other_cpu = sum(split[k][1] - split0[k][1] for k in split)
    after = {s.name: parse_metrics((await client.get(s.url + "/metrics")).text) for s in servers}
    rows = sum(after[k]["rows_sum"] - before[k]["rows_sum"] for k in after)
    batches = sum(after[k]["batches"] - before[k]["batches"] for k in after)
    in_batches = sum(after[k]["batch_seconds"] - before[k]["batch_seconds"] for k in after)
    done = max(r["requests"], 1)
    r |= {"peak_rss_mb": {k: round(v, 1) for k, v in smp.peak.items()}, "peak_rss_total_mb": round(smp.peak_total, 1),
          "server_cpu_ms_per_request": round(1000 * cpu / done, 3),
          "server_loop_cpu_ms_per_request": round(1000 * loop_cpu / done, 3),
          "server_batcher_cpu_ms_per_request": round(1000 * other_cpu / done, 3),
          "client_cpu_ms_per_request": round(1000 * mine / done, 3),
          "server_cpu_share": round(cpu / r["wall_s"], 3) if r["wall_s"] else None,
          "client_cpu_share": round(mine / r["wall_s"], 3) if r["wall_s"] else None,
          "batches": int(batches), "rows_per_batch": round(rows / batches, 2) if batches else None,
          "batch_ms_per_request": round(1000 * in_batches / done, 3)}
    return r


def summarise(runs: list[dict]) -> dict:
    """Median of the repeats' figures; latency percentiles over every request of every repeat."""
    lat = [x for r in runs for x in r["latencies"]]
    med = lambda key: statistics.median(r[key] for r in runs if r.get(key) is not None) if any(  # noqa: E731
        r.get(key) is not None for r in runs) else None
    out = {"requests_per_s": round(med("requests_per_s"), 2), "latency_ms": percentiles(lat),
           "requests": sum(r["requests"] for r in runs), "errors": sum(r["errors"] for r in runs),
           "error_kinds": dict(sum((Counter(r["error_kinds"]) for r in runs), Counter())),
           "peak_rss_total_mb": max(r["peak_rss_total_mb"] for r in runs),
           "peak_rss_mb": {k: max(r["peak_rss_mb"][k] for r in runs) for k in runs[0]["peak_rss_mb"]}}
    for key in ("server_cpu_ms_per_request", "server_loop_cpu_ms_per_request", "server_batcher_cpu_ms_per_request",
                "client_cpu_ms_per_request", "server_cpu_share", "client_cpu_share",
                "rows_per_batch", "batch_ms_per_request"):
        v = med(key)
        out[key] = round(v, 3) if v is not None else None
    out["repeats"] = [{k: v for k, v in r.items() if k != "latencies"} for r in runs]
    return out


# ----------------------------------------------------------------------------- inputs
def short_texts() -> list[str]:
    from frozentune.data import data_root, read_split
    return list(read_split(data_root() / "sst2" / "test.jsonl").texts)


def long_texts(n: int = 1000, seed: int = 0) -> list[str]:
    """A seeded sample of n IMDB test reviews; a file of n or fewer is taken whole, in its order (the
    slice bench/gpu_serve_prepare.sh writes is this sample, in this order)."""
    from frozentune.data import data_root, read_split
    texts = list(read_split(data_root() / "imdb" / "test.jsonl").texts)
    return texts if len(texts) <= n else random.Random(seed).sample(texts, n)


def e2e_sources() -> list[str]:
    from frozentune.data import load_generation
    return [ex.source for ex in load_generation("e2e", "test")]


def train_heads(folder: Path) -> dict:
    """The 8 classification heads (trained when missing) and their test accuracy."""
    folder.mkdir(parents=True, exist_ok=True)
    info = {}
    for name, method, layer in HEADS:
        out = folder / name
        if not (out / "config.json").is_file():
            args = ["train", "--method", method, "--layer", str(layer), *TRAIN_ARGS, "--quiet", "--output", str(out),
                    "--overwrite"]
            log(f"training {name}: frozentune {' '.join(args)}")
            t0 = time.perf_counter()
            with open(folder / f"{name}.train.log", "w") as f:
                p = subprocess.run([*ft(), *args], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if p.returncode != 0:
                raise RuntimeError(f"training {name} failed ({p.returncode}); see {folder / f'{name}.train.log'}")
            log(f"  {time.perf_counter() - t0:.0f}s")
        res = json.loads((out / "result.json").read_text())
        info[name] = {"method": method, "layer": layer, "test_accuracy": res["metrics"]["accuracy"],
                      "trainable_params": res.get("trainable_params")}
    return {"train_command": "frozentune train --method M --layer L " + " ".join(TRAIN_ARGS), "heads": info}


def make_prefixes(folder: Path, max_new_tokens: int) -> dict:
    """8 generation folders: SmolLM2-135M's keys/values on 8 phrases (init=words, untrained), saved as
    a prefix-tuning run saves them; checked once with `frozentune generate --model`."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"gen{i}" for i in range(len(PHRASES))]
    missing = [i for i, n in enumerate(names) if not (folder / n / "config.json").is_file()]
    if missing:
        import dataclasses

        from frozentune.backbone import load_causal_lm
        from frozentune.generation.run import DecodeOptions
        from frozentune.generation.prefix import PrefixConfig, PrefixTuner
        log(f"making {len(missing)} prefix folders on smollm2-135m")
        lm, tok = load_causal_lm("smollm2-135m")
        for i in missing:
            tuner = PrefixTuner(PrefixConfig(init="words", init_text=PHRASES[i]), lm, tok, "smollm2-135m")
            tmp = folder / f".{names[i]}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            tuner.save(tmp, extra={"task": "generation", "data": "e2e",
                                   "decoding": dataclasses.asdict(DecodeOptions(num_beams=1, max_new_tokens=max_new_tokens)),
                                   "note": f"untrained: init=words on {PHRASES[i]!r} (bench/serve_load.py)"})
            tmp.rename(folder / names[i])
        del lm
    check = folder / "generate-check.json"
    if not check.is_file():
        src = "name[Aromi], eatType[coffee shop], area[city centre]"
        p = subprocess.run([*ft(), "generate", "--model", str(folder / names[0]), src, "--num-beams", "1",
                            "--max-new-tokens", "12", "--json"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"frozentune generate --model {folder / names[0]} failed: {p.stderr.strip()[-500:]}")
        check.write_text(json.dumps({"command": f"frozentune generate --model {names[0]} {src!r} --num-beams 1 "
                                                f"--max-new-tokens 12 --json", "output": p.stdout.strip()}))
    return {"folders": names, "phrases": PHRASES, "generate_check": json.loads(check.read_text())}


# ----------------------------------------------------------------------------- part 1: heads
def classify_sender(clients: "Clients | RawClients", url: str, bodies: list[bytes], want_tasks: int):
    async def send(i: int, k: int) -> tuple[bool, dict]:
        status, payload = await post_classify(clients, k, 0, url, bodies[i % len(bodies)])
        if status != 200:
            return False, {"error": f"HTTP {status}"}
        row = json.loads(payload)["results"][0]
        if len(row["tasks"]) != want_tasks:
            return False, {"error": f"{len(row['tasks'])} tasks answered, expected {want_tasks}"}
        return True, {"truncated": int(row["truncated"])}
    return send


def fanout_sender(clients: "Clients | RawClients", urls: list[str], bodies: list[bytes]):
    async def one(k: int, j: int, url: str, body: bytes) -> tuple[bool, dict]:
        status, payload = await post_classify(clients, k, j, url, body)
        if status != 200:
            return False, {"error": f"HTTP {status}"}
        return True, {"truncated": int(json.loads(payload)["results"][0]["truncated"])}

    async def send(i: int, k: int) -> tuple[bool, dict]:
        got = await asyncio.gather(*(one(k, j, u, bodies[i % len(bodies)]) for j, u in enumerate(urls)))
        bad = [g for g in got if not g[0]]
        if bad:
            return False, bad[0][1]
        return True, {"truncated": max(g[1]["truncated"] for g in got)}
    return send


async def part_heads(a, client, heads_dir: Path, logdir: Path) -> dict:
    texts = {"short": short_texts(), "long": long_texts()}
    bodies = {k: [json.dumps({"text": t}).encode() for t in v] for k, v in texts.items()}
    folders = [heads_dir / n for n, _, _ in HEADS]
    core = a.heads_core  # only the 1- and 8-head servers and their twins: the 8/1 ratio, in less time
    specs = [(f"heads{n}", folders[:n], []) for n in ((1, 8) if core else (1, 4, 8))]
    if not core:
        specs += [(f"single-{HEADS[i][0]}", [folders[i]], []) for i in range(8)]
        specs.append(("light", [heads_dir / n for n, _, _ in LIGHT], []))
    # beside the default, the 1- and 8-head servers with --twin-args: by default --pipeline off (every batch's
    # heads after its pass on one thread, against auto's heads beside the next pass where torch leaves a core free)
    twin, tkey = a.twin_args, twin_key(a.twin_args)
    specs += [(f"heads{n}-after", folders[:n], shlex.split(twin)) for n in (1, 8)]
    servers = await start(client, specs, a.threads, logdir)
    pool = client_pool(a.client)
    try:
        by = {s.name: s for s in servers}
        configs = {"1 head": ([by["heads1"]], lambda b: classify_sender(pool, by["heads1"].url, b, 1)),
                   "8 heads": ([by["heads8"]], lambda b: classify_sender(pool, by["heads8"].url, b, 8)),
                   f"1 head, {twin}": ([by["heads1-after"]], lambda b: classify_sender(pool, by["heads1-after"].url, b, 1)),
                   f"8 heads, {twin}": ([by["heads8-after"]], lambda b: classify_sender(pool, by["heads8-after"].url, b, 8))}
        if not core:
            singles = [by[f"single-{h[0]}"] for h in HEADS]
            configs |= {"4 heads": ([by["heads4"]], lambda b: classify_sender(pool, by["heads4"].url, b, 4)),
                        f"{len(LIGHT)} heads, no self-explaining": (
                            [by["light"]], lambda b: classify_sender(pool, by["light"].url, b, len(LIGHT))),
                        "8 servers × 1 head": (singles, lambda b: fanout_sender(pool, [s.url for s in singles], b))}
        idle = {s.name: round(s.rss_mb(), 1) for s in servers}
        runs: dict[tuple[str, str], list[dict]] = {}
        for rep in range(a.repeats):
            for ts in ("short", "long"):
                for cname, (srv, make) in configs.items():
                    send = make(bodies[ts])
                    if rep == 0:  # warm-up: not counted (--warm-requests; each server's first shapes cost once)
                        await closed_loop(send, a.clients, min(a.warm_requests, a.requests), a.seconds, start_index=10**6)
                    r = await measured(client, srv, send, a.clients, a.requests, a.seconds, start_index=rep * a.requests)
                    runs.setdefault((cname, ts), []).append(r)
                    log(f"heads rep {rep + 1} {ts:5s} {cname:20s} {r['requests_per_s']:8.1f} req/s  p50 "
                        f"{r['latency_ms']['p50']} ms  p99 {r['latency_ms']['p99']} ms  rss {r['peak_rss_total_mb']:.0f} MB"
                        f"  errors {r['errors']}")
        results = []
        for (cname, ts), rr in runs.items():
            s = summarise(rr)
            s |= {"config": cname, "texts": ts,
                  "truncated_share": round(sum(r["sums"].get("truncated", 0) for r in rr) / max(s["requests"], 1), 3)}
            results.append(s)
        hwm = {s.name: s.hwm_mb() for s in servers}
        on_gpu = gpu_memory_mb()
        gpu_mb = {s.name: on_gpu[s.proc.pid] for s in servers if s.proc.pid in on_gpu}
        server_info = {s.name: s.describe() for s in servers}
    finally:
        await pool.aclose()
        stop_all(servers)
    costs = head_costs(heads_dir, a.threads, a.device)
    get = {(r["config"], r["texts"]): r for r in results}
    ratios = {}
    for ts in ("short", "long"):
        one, eight = get[("1 head", ts)], get[("8 heads", ts)]
        one_after, eight_after = get[(f"1 head, {twin}", ts)], get[(f"8 heads, {twin}", ts)]
        ratios[ts] = {"8_heads_vs_1_head_requests_per_s": eight["requests_per_s"] / one["requests_per_s"],
                      f"8_heads_vs_1_head_requests_per_s_{tkey}": eight_after["requests_per_s"] / one_after["requests_per_s"],
                      **({"8_heads_pipeline_on_vs_off_requests_per_s": eight["requests_per_s"] / eight_after["requests_per_s"]}
                         if tkey == "pipeline_off" else
                         {f"8_heads_default_vs_{tkey}_requests_per_s": eight["requests_per_s"] / eight_after["requests_per_s"],
                          f"1_head_default_vs_{tkey}_requests_per_s": one["requests_per_s"] / one_after["requests_per_s"]}),
                      "8_heads_vs_1_head_server_cpu_per_request": (eight["server_cpu_ms_per_request"]
                                                                    / one["server_cpu_ms_per_request"]),
                      "8_heads_vs_1_head_rss": eight["peak_rss_total_mb"] / one["peak_rss_total_mb"]}
        if not core:
            light, multi = get[(f"{len(LIGHT)} heads, no self-explaining", ts)], get[("8 servers × 1 head", ts)]
            ratios[ts] |= {"light_heads_vs_1_head_requests_per_s": light["requests_per_s"] / one["requests_per_s"],
                           "light_heads_vs_1_head_rss": light["peak_rss_total_mb"] / one["peak_rss_total_mb"],
                           "8_heads_vs_8_servers_requests_per_s": eight["requests_per_s"] / multi["requests_per_s"],
                           "8_servers_vs_8_heads_total_rss": multi["peak_rss_total_mb"] / eight["peak_rss_total_mb"]}
    return {"texts": {"short": f"SST-2 test, {len(texts['short'])} sentences",
                      "long": f"IMDB test, {len(texts['long'])} reviews (seeded sample); the models read the first 128 "
                              f"tokens (max_length 128)"},
            "heads_in_order": [h[0] for h in HEADS], "twin_args": twin, "core_only": core, "servers": server_info, "idle_rss_mb": idle, "vm_hwm_mb": hwm,
            "gpu_memory_mb_at_end": gpu_mb or None,
            "results": results, "ratios": ratios, "head_costs": costs,
            "goals": {"8_heads_vs_1_head_requests_per_s": ">= 0.9", "8_heads_vs_1_head_rss": "<= 1.1"}}


def twin_key(args: str) -> str:
    """The twin servers' options as a JSON key part: '--pipeline off' → pipeline_off."""
    return re.sub(r"\W+", "_", args).strip("_")


def gpu_memory_mb() -> dict[int, float]:
    """GPU memory per process id from nvidia-smi; empty where there is none (or it lists no processes)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        p = subprocess.run([exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
        out = {}
        for line in p.stdout.splitlines():
            with contextlib.suppress(ValueError):
                pid, mem = (x.strip() for x in line.split(","))
                out[int(pid)] = float(mem)
        return out
    return {}


def head_costs(heads_dir: Path, threads: int, device: str | None = None, rows: int = 16, repeats: int = 5) -> dict:
    """Where a batch's time goes in the 8-head server's group, measured in this process with the
    server's code (torch on `threads` threads): the shared backbone pass, then each head (its layer
    choice, the head, each row's answer), on `rows` short and `rows` long texts."""
    import torch

    from frozentune.backbone import select_layers
    from frozentune.head import Features
    from frozentune.model import as_cached
    from frozentune.serve.engine import Engine
    from frozentune.serve.models import _batch, classify_rows
    from gpu_extract import sync

    torch.set_num_threads(threads)
    engine = Engine.load([heads_dir / n for n, _, _ in HEADS], device, log=lambda line: None)
    try:
        group = engine.groups[0]
        bb = group.backbone
        out = {"rows": rows, "threads": torch.get_num_threads(), "texts": {}}
        for name, texts in (("short", short_texts()[:rows]), ("long", long_texts()[:rows])):
            jobs, _ = engine.plan_classify(texts)
            padded = _batch(jobs, bb.pad_id(), bb.device, jobs[0].key, bb.max_length)  # as FrozenPass.run
            ids, mask = padded.ids, padded.mask
            fmask, idx = mask.bool(), list(range(len(jobs)))

            def timed(fn) -> float:
                fn()
                sync(bb.device)  # a GPU's queued kernels, before and after the clock
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fn()
                sync(bb.device)
                return 1000 * (time.perf_counter() - t0) / repeats

            states = bb.hidden_states(ids, mask)
            keys = {(t.model.backbone_ref.layers, t.model.cache_dtype) for t in group.tasks}

            def select() -> dict:  # as FrozenPass.run: one selection per (layers, dtype), shared by its heads
                return {k: as_cached(select_layers(states, k[0]), k[1]) for k in keys}

            chosen = select()
            row = {"tokens": list(ids.shape), "pass_ms": round(timed(lambda: bb.hidden_states(ids, mask)), 2),
                   "select_ms": round(timed(select), 2), "heads_ms": {}}
            for task in group.tasks:
                def head(task=task) -> None:
                    m = task.model
                    with torch.no_grad():  # the pass's precision, as FrozenPass.heads passes it (the bf16 span product)
                        o = m.head(Features(chosen[(m.backbone_ref.layers, m.cache_dtype)], fmask, None,
                                            m.backbone_ref.precision))
                    classify_rows(task, o, jobs, idx)
                row["heads_ms"][task.name] = round(timed(head), 2)
            row["heads_total_ms"] = round(sum(row["heads_ms"].values()), 2)
            row["group_run_ms"] = round(timed(lambda: group.run(jobs)), 2)  # the server's own call, all of it
            if group.graphs is not None:  # on a GPU (--cuda-graphs auto): the same call with the heads run eagerly
                kept, group.graphs = group.graphs, None
                row["group_run_ms_no_graphs"] = round(timed(lambda: group.run(jobs)), 2)
                group.graphs = kept
                row["graphs"] = kept.describe()
            out["texts"][name] = row
            log(f"head costs {name} {tuple(ids.shape)}: pass {row['pass_ms']:.1f} ms, layer selection "
                f"{row['select_ms']:.1f}, heads " + ", ".join(f"{k} {v:.1f}" for k, v in row["heads_ms"].items())
                + f"; the whole batch {row['group_run_ms']:.1f} ms"
                + (f" (without CUDA graphs {row['group_run_ms_no_graphs']:.1f} ms; {row['graphs']})"
                   if "graphs" in row else ""))
        return out
    finally:
        engine.close()


# ----------------------------------------------------------------------------- part 2: batching
def hf_loop(texts: list[str], threads: int, n: int, seconds: float, sizes=(1, 8, 32), device: str | None = None) -> dict:
    """Texts/s of a plain Hugging Face loop over `texts` (tokenizer + model, no_grad) per batch size,
    fp32 and bf16 as the server runs MiniLM (frozentune's prepare: bf16 Linear weights + autocast).
    On a GPU (`device`) the inputs go there and each batch is waited for, as a loop that reads its
    outputs would."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from frozentune.backbone import ALIASES
    from frozentune.extract.precision import prepare
    from gpu_extract import sync

    torch.set_num_threads(threads)
    path = ALIASES["minilm"]()
    tok = AutoTokenizer.from_pretrained(path)
    dev = torch.device(device or "cpu")
    model = AutoModel.from_pretrained(path).eval().to(dev)
    out = {"model": "all-MiniLM-L6-v2 (transformers AutoModel)", "max_length": 128, "threads": torch.get_num_threads(),
           "device": str(dev), "rows": []}
    for precision in ("fp32", "bf16"):
        runner = model if precision == "fp32" else prepare(model, "bf16", dev)
        for bs in sizes:
            def batch(i: int) -> None:
                chunk = [texts[(i + j) % len(texts)] for j in range(bs)]
                enc = tok(chunk, padding=True, truncation=True, max_length=128, return_tensors="pt").to(dev)
                with torch.no_grad():
                    runner(**enc)
                sync(dev)
            batch(0)  # warm-up
            done, t0 = 0, time.perf_counter()
            while done < n and time.perf_counter() - t0 < seconds:
                batch(done)
                done += bs
            wall = time.perf_counter() - t0
            out["rows"].append({"precision": precision, "batch": bs, "texts": done, "seconds": round(wall, 3),
                                "texts_per_s": round(done / wall, 2)})
            log(f"hf loop {precision} batch {bs:3d}: {done / wall:8.1f} texts/s")
    return out


# the default server with its pass padded (--no-pack-tokens): batching alone, without the packed pass
PADDED = "batching-default, padded pass"


async def part_batching(a, client, heads_dir: Path, logdir: Path) -> dict:
    texts = short_texts()
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    one = [heads_dir / HEADS[0][0]]
    servers = await start(client, [("batching-off", one, ["--batch-tokens", "1"]), ("batching-default", one, []),
                                   (PADDED, one, ["--no-pack-tokens"])], a.threads, logdir)
    pool = client_pool(a.client)
    try:
        runs: dict[str, list[dict]] = {}
        for rep in range(a.repeats):
            for s in servers:
                send = classify_sender(pool, s.url, bodies, 1)
                if rep == 0:
                    await closed_loop(send, a.clients, min(2 * a.clients, a.requests), a.seconds, start_index=10**6)
                r = await measured(client, [s], send, a.clients, a.requests, a.seconds, start_index=rep * a.requests)
                runs.setdefault(s.name, []).append(r)
                log(f"batching rep {rep + 1} {s.name:17s} {r['requests_per_s']:8.1f} req/s  rows/batch "
                    f"{r['rows_per_batch']}  p50 {r['latency_ms']['p50']} ms  errors {r['errors']}")
        server_info = {s.name: s.describe() for s in servers}
    finally:
        await pool.aclose()
        stop_all(servers)
    results = {k: summarise(v) for k, v in runs.items()}
    ratio = results["batching-default"]["requests_per_s"] / results["batching-off"]["requests_per_s"]
    packing = results["batching-default"]["requests_per_s"] / results[PADDED]["requests_per_s"]
    gpu = bool(a.device and a.device.startswith("cuda"))
    hf = hf_loop(texts, a.threads, max(a.requests, 64), min(a.seconds, 10.0), (1, 8, 32, 128) if gpu else (1, 8, 32),
                 a.device)
    return {"texts": f"SST-2 test, {len(texts)} sentences", "servers": server_info, "results": results,
            "default_vs_off_requests_per_s": ratio, "goal": ">= 8" if gpu else ">= 1.7", "hf_loop": hf,
            "packed_vs_padded_requests_per_s": packing,
            "batch_tokens_1_means": "batcher.py _gather: a second row would make rows × longest > 1, so every batch is "
                                    "one row, started at once (no wait)"}


# ----------------------------------------------------------------------------- part 3: generation
async def part_generation(a, client, gen_dir: Path, logdir: Path) -> dict:
    """The modes below on one server per --gen-precisions value, one after the other."""
    info = make_prefixes(gen_dir, a.gen_new_tokens)
    sources = e2e_sources()
    out = {"lm": "smollm2-135m", "prefixes": info, "sources": f"E2E test meaning representations ({len(sources)}), "
           f"request i gets source i", "decoding": {"num_beams": 1, "max_new_tokens": a.gen_new_tokens,
                                                    "min_new_tokens": a.gen_min_new_tokens},
           "goals": {"mixed_vs_one_prefix": ">= 0.9", "mixed_vs_one_at_a_time": ">= 4"}, "precisions": {}}
    for precision in a.gen_precisions.split(","):
        out["precisions"][precision] = await generation_modes(a, client, gen_dir, logdir, info["folders"], sources,
                                                              precision)
    return out


async def generation_modes(a, client, gen_dir: Path, logdir: Path, names: list[str], sources: list[str],
                           precision: str) -> dict:
    servers = await start(client, [(f"generation-{precision}", [gen_dir / n for n in names],
                                    ["--precision", precision])], a.threads, logdir)
    srv = servers[0]
    pool = Clients()  # httpx: generation requests are few and long, the client's CPU does not matter there
    outputs: dict[tuple[str, str], list[str]] = {}

    def sender(prefix_of: Callable[[int, int], str]):
        async def send(i: int, k: int) -> tuple[bool, dict]:
            p, s = prefix_of(i, k), sources[i % len(sources)]
            body = {"prefix": p, "source": s, "num_beams": 1, "max_new_tokens": a.gen_new_tokens,
                    "min_new_tokens": a.gen_min_new_tokens}
            r = await pool(k).post(srv.url + "/v1/generate", json=body)
            if r.status_code != 200:
                return False, {"error": f"HTTP {r.status_code}: {r.text[:100]}"}
            o = r.json()["outputs"][0]
            outputs.setdefault((p, s), []).append(o["output"])
            return True, {"tokens": o["tokens"]}
        return send

    modes = {"8 clients, 8 different prefixes": (8, sender(lambda i, k: names[k % len(names)])),
             "8 clients, one prefix": (8, sender(lambda i, k: names[0])),
             "one request at a time": (1, sender(lambda i, k: names[i % len(names)])),
             # the library's own figure (bench/prefix_mixed.py) is a batch of 16: two clients per prefix
             "16 clients, 8 different prefixes": (16, sender(lambda i, k: names[k % len(names)]))}
    try:
        runs: dict[str, list[dict]] = {}
        for rep in range(a.repeats):
            for mode, (clients, send) in modes.items():
                if rep == 0:
                    await closed_loop(send, clients, clients, a.gen_seconds, start_index=10**6)
                r = await measured(client, [srv], send, clients, a.gen_requests, a.gen_seconds, start_index=0,
                                   sampler_every=0.5)
                r["tokens_per_s"] = r["sums"].get("tokens", 0) / r["wall_s"]
                runs.setdefault(mode, []).append(r)
                log(f"generation {precision} rep {rep + 1} {mode:32s} {r['tokens_per_s']:7.1f} tok/s  {r['requests']} requests  "
                    f"rows/batch {r['rows_per_batch']}  errors {r['errors']}")
        server_info = srv.describe()
    finally:
        await pool.aclose()
        stop_all(servers)
    results = {}
    for mode, rr in runs.items():
        s = summarise(rr)
        s["tokens_per_s"] = round(statistics.median(r["tokens_per_s"] for r in rr), 2)
        s["tokens"] = sum(r["sums"].get("tokens", 0) for r in rr)
        s["tokens_per_request"] = round(s["tokens"] / max(s["requests"], 1), 2)
        results[mode] = s
    m, one, seq, m16 = (results[k]["tokens_per_s"] for k in modes)
    again = [v for v in outputs.values() if len(v) > 1]
    return {"server": server_info, "results": results,
            "mixed_vs_one_prefix": m / one if one else None, "mixed_vs_one_at_a_time": m / seq if seq else None,
            "mixed16_vs_one_at_a_time": m16 / seq if seq else None,
            "same_output_check": {"pairs_seen_more_than_once": len(again),
                                  "pairs_with_differing_outputs": sum(len(set(v)) > 1 for v in again)}}


# ----------------------------------------------------------------------------- part 4: bad requests
def bad_cases(tasks: dict) -> list[tuple[str, str, str, Any]]:
    """(case, method, path, body): body bytes are sent as is, anything else as JSON."""
    c, g, exp = tasks["classify"], tasks["generate"], tasks["explains"]
    big = ("a truly great film " * 55_189).encode()[:2**20]
    big_json = b'{"text": "' + big + b'"}'
    return [
        ("malformed JSON", "POST", "/v1/classify", b'{"texts": ["a good film"'),
        ("body not UTF-8", "POST", "/v1/classify", b'{"text": "caf\xe9"}'),
        ("body a JSON list", "POST", "/v1/classify", ["a good film"]),
        ("texts a string", "POST", "/v1/classify", {"texts": "a good film"}),
        ("texts of numbers", "POST", "/v1/classify", {"texts": [1, 2]}),
        ("text a number", "POST", "/v1/classify", {"text": 5}),
        ("tasks a string", "POST", "/v1/classify", {"text": "a good film", "tasks": c}),
        ("both text and texts", "POST", "/v1/classify", {"text": "a", "texts": ["b"]}),
        ("neither text nor texts", "POST", "/v1/classify", {}),
        ("empty text", "POST", "/v1/classify", {"text": ""}),
        ("whitespace text", "POST", "/v1/classify", {"texts": ["fine", "   "]}),
        ("empty texts list", "POST", "/v1/classify", {"texts": []}),
        ("unknown task", "POST", "/v1/classify", {"text": "a good film", "tasks": ["no-such-task"]}),
        ("generation task asked to classify", "POST", "/v1/classify", {"text": "a good film", "tasks": [g]}),
        ("1 MB text", "POST", "/v1/classify", big_json),
        ("65 texts (limit 64)", "POST", "/v1/classify", {"texts": ["a good film"] * 65}),
        ("top 0", "POST", "/v1/explain", {"text": "a good film", "top": 0}),
        ("top 51 (limit 50)", "POST", "/v1/explain", {"text": "a good film", "top": 51}),
        ("explain a task that does not explain", "POST", "/v1/explain", {"text": "a good film", "tasks": [c]}),
        ("extra field", "POST", "/v1/classify", {"text": "a good film", "colour": "blue"}),
        ("unknown prefix", "POST", "/v1/generate", {"prefix": "no-such-prefix", "source": "name[Aromi]"}),
        ("classifier as prefix", "POST", "/v1/generate", {"prefix": c, "source": "name[Aromi]"}),
        ("num_beams 0", "POST", "/v1/generate", {"prefix": g, "source": "name[Aromi]", "num_beams": 0}),
        ("max_new_tokens 10000", "POST", "/v1/generate", {"prefix": g, "source": "name[Aromi]", "max_new_tokens": 10000}),
        ("min_new_tokens > max_new_tokens", "POST", "/v1/generate",
         {"prefix": g, "source": "name[Aromi]", "max_new_tokens": 8, "min_new_tokens": 9}),
        ("1 MB source", "POST", "/v1/generate", {"prefix": g, "source": "name[Aromi], " * 80_000}),
        ("GET on a POST endpoint", "GET", "/v1/classify", None),
        ("unknown path", "GET", "/v1/nothing-here", None),
        ("valid request (control)", "POST", "/v1/classify", {"text": "a good film", "tasks": [c, exp]}),
    ]


async def part_bad(a, client, heads_dir: Path, gen_dir: Path, logdir: Path) -> dict:
    make_prefixes(gen_dir, a.gen_new_tokens)
    c, e, g = HEADS[0][0], HEADS[1][0], "gen0"
    servers = await start(client, [("bad", [heads_dir / c, heads_dir / e, gen_dir / g], [])], a.threads, logdir)
    srv = servers[0]
    rows = []
    try:
        for case, method, path, body in bad_cases({"classify": c, "explains": e, "generate": g}):
            kw: dict = {}
            if isinstance(body, bytes):
                kw = {"content": body, "headers": JSON_HEADERS}
            elif body is not None:
                kw = {"json": body}
            t0 = time.perf_counter()
            try:
                r = await client.request(method, srv.url + path, timeout=120.0, **kw)
                status, text = r.status_code, r.text
            except Exception as ex:
                status, text = None, f"{type(ex).__name__}: {ex}"
            ms = 1000 * (time.perf_counter() - t0)
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and "error" in doc:
                message = doc["error"]
            elif isinstance(doc, dict) and "results" in doc:
                row = doc["results"][0]
                message = f"truncated: {json.dumps(row.get('truncated'))}; note: {row.get('note')}"
            else:
                message = text[:300]
            t1 = time.perf_counter()
            try:
                h = await client.get(srv.url + "/health", timeout=10.0)
                health = h.status_code
            except Exception as ex:
                health = f"{type(ex).__name__}"
            size = len(body) if isinstance(body, bytes) else len(json.dumps(body).encode()) if body is not None else 0
            rows.append({"case": case, "method": method, "path": path, "body_bytes": size, "status": status,
                         "error_shape": isinstance(doc, dict) and set(doc) == {"error"},
                         "message": message, "ms": round(ms, 1), "health_after": health,
                         "health_ms": round(1000 * (time.perf_counter() - t1), 1)})
            log(f"bad: {case:38s} → {status}  health {health}  {ms:.0f} ms  {message[:90]}")
        server_info = srv.describe()
        alive = srv.proc.poll() is None
    finally:
        stop_all(servers)
    return {"server": server_info, "rows": rows, "server_alive_at_end": alive}


# ----------------------------------------------------------------------------- part 5: soak
async def open_loop(send, rate: float, seconds: float, clients: int, start_index: int) -> dict:
    """Requests started at a fixed `rate` for `seconds` (open loop: a slow answer does not slow the
    sending), on 2 × `clients` connections; past 64 × `clients` unanswered the client drops (counted).
    Latency runs from each request's scheduled start, so a wait for a connection counts."""
    lat: list[float] = []
    errors: Counter = Counter()
    state = {"inflight": 0, "dropped": 0, "max_inflight": 0, "late_s": 0.0, "late_50ms": 0}
    cap, tasks, free = 64 * clients, set(), asyncio.Queue()
    for k in range(2 * clients):
        free.put_nowait(k)

    async def one(i: int) -> None:
        t = time.perf_counter()
        k = await free.get()
        try:
            ok, info = await send(i, k)
        except Exception as e:
            ok, info = False, {"error": type(e).__name__}
        finally:
            free.put_nowait(k)
            state["inflight"] -= 1
        if ok:
            lat.append(time.perf_counter() - t)
        else:
            errors[info.get("error", "?")] += 1

    t0 = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            state["late_s"] = max(state["late_s"], -delay)
            state["late_50ms"] += delay < -0.05
        if state["inflight"] >= cap:
            state["dropped"] += 1
            continue
        state["inflight"] += 1
        state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        task = asyncio.get_running_loop().create_task(one(start_index + i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(set(tasks), timeout=120)
    return {"scheduled": total, "lat": lat, "errors": errors, "wall": time.perf_counter() - t0, **state}


async def part_soak(a, client, heads_dir: Path, logdir: Path, previous: dict | None) -> dict:
    """The 8-head server at --soak-load of its capacity for --soak seconds, open loop, after a
    warm-up of --soak-warm seconds in the same traffic. Memory is read at four points: idle (loaded,
    no request yet), at the warm-up's first request, at the soak's first request and at its end."""
    texts = short_texts()
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    folders = [heads_dir / n for n, _, _ in HEADS]
    servers = await start(client, [("soak-heads8", folders, shlex.split(a.soak_server_args))], a.threads, logdir)
    srv = servers[0]
    pool = client_pool(a.client)
    send = classify_sender(pool, srv.url, bodies, 8)
    try:
        idle = srv.rss_mb()
        capacity, source = a.soak_rate, "--soak-rate"
        if capacity is None:
            prev = None
            if previous and previous.get("threads") == a.threads:
                prev = next((r["requests_per_s"] for r in previous["results"]
                             if r["config"] == "8 heads" and r["texts"] == "short"), None)
            if prev:
                capacity, source = prev, "the JSON's heads part (8 heads, short texts)"
            else:
                await closed_loop(send, a.clients, 2 * a.clients, 30, start_index=10**6)
                r = await closed_loop(send, a.clients, 10**9, min(a.seconds, 30), start_index=10**6)
                capacity, source = r["requests_per_s"], f"measured here ({r['requests']} requests, {a.clients} clients)"
        rate = a.soak_load * capacity
        warm: dict = {}
        if a.soak_warm > 0:  # the same open-loop traffic, so that the soak starts from the memory that traffic needs
            log(f"soak: warm-up {a.soak_warm:.0f}s at {rate:.1f} req/s")
            with Sampler([srv], every=1.0, series_every=10.0) as wsmp:
                w = await open_loop(send, rate, a.soak_warm, a.clients, 2 * 10**6)
            warm = {"seconds": a.soak_warm, "answered_ok": len(w["lat"]), "errors": sum(w["errors"].values()),
                    "rss_mb": {"start": round(wsmp.first, 1), "end": round(wsmp.last, 1)},
                    "rss_series_mb": wsmp.series}
        log(f"soak: {a.soak:.0f}s at {rate:.1f} req/s ({a.soak_load:.0%} of {capacity:.1f}, {source})")
        import psutil
        cpu0 = srv.cpu_s()
        me, mine0 = psutil.Process(), sum(psutil.Process().cpu_times()[:2])
        with Sampler([srv], every=1.0, series_every=10.0) as smp:
            r = await open_loop(send, rate, a.soak, a.clients, 0)
        rss_start, rss_end, rss_max, wall, lat = smp.first, smp.last, smp.peak_total, r["wall"], r["lat"]
        early = next((v for t, v in smp.series if t >= 0.1 * a.soak), None)
        half = next((v for t, v in smp.series if t >= 0.5 * a.soak), None)
        first = warm["rss_mb"]["start"] if warm else rss_start
        out = {"soak_seconds": a.soak, "warm_up": warm, "capacity_requests_per_s": round(capacity, 2),
               "capacity_from": source, "load": a.soak_load, "target_requests_per_s": round(rate, 2),
               "scheduled": r["scheduled"], "answered_ok": len(lat), "achieved_requests_per_s": round(len(lat) / wall, 2),
               "wall_s": round(wall, 1), "errors": sum(r["errors"].values()), "error_kinds": dict(r["errors"]),
               "dropped_by_client": r["dropped"], "max_in_flight": r["max_inflight"],
               "client_late_max_s": round(r["late_s"], 3), "client_late_over_50ms": r["late_50ms"],
               "latency_ms": percentiles(lat),
               "rss_mb": {"idle": round(idle, 1), "first_request": round(first, 1), "start": round(rss_start, 1),
                          "end": round(rss_end, 1), "max": round(rss_max, 1)},
               "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 2),
               "rss_growth_from_first_request_pct": round(100 * (rss_end - first) / first, 2),
               "rss_growth_after_first_10pct": round(100 * (rss_end - early) / early, 2) if early else None,
               "rss_growth_second_half_pct": round(100 * (rss_end - half) / half, 2) if half else None,
               "rss_series_mb": smp.series, "server_cpu_share": round((srv.cpu_s() - cpu0) / wall, 3),
               "client_cpu_share": round((sum(me.cpu_times()[:2]) - mine0) / wall, 3),
               "vm_hwm_mb": srv.hwm_mb(),  # the allocator the server said it runs on (/v1/models; before it had one: LD_PRELOAD)
               "allocator": srv.models.get("allocator") or os.environ.get("LD_PRELOAD") or "glibc malloc",
               "server": srv.describe()}
        log(f"soak: {out['answered_ok']} ok, {out['errors']} errors, RSS {rss_start:.0f} → {rss_end:.0f} MB "
            f"(max {rss_max:.0f}, {out['rss_growth_pct']:+.2f}%; from the first request {first:.0f} MB, "
            f"{out['rss_growth_from_first_request_pct']:+.2f}%)")
        return out
    finally:
        await pool.aclose()
        stop_all(servers)


# ----------------------------------------------------------------------------- report
def _f(v, spec: str = ",.1f") -> str:
    if v is None:
        return "–"
    return format(v, spec[:-1]) + "%" if spec.endswith("%") else format(v, spec)


def _goal(v: float | None, goal: str) -> str:
    if v is None:
        return "–"
    op, x = goal.split()
    ok = v >= float(x) if op == ">=" else v <= float(x)
    return f"{v:.2f}x (goal {op.replace('>=', '≥').replace('<=', '≤')} {x}: {'met' if ok else 'NOT met'})"


def report(d: dict) -> str:
    m = d.get("machine", {})
    lines = ["# `frozentune serve` under load (bench/serve_load.py)", "",
             f"Machine: {m.get('cpu')}, {m.get('cores')} cores"
             f"{f', GPU {gpu}, every server and the plain loop on --device {dev}' if (gpu := m.get('gpu')) and (dev := m.get('device', '')).startswith('cuda') else ''}"
             f", torch {m.get('torch')}; loopback (127.0.0.1); each "
             f"server pinned to its --threads torch threads (OMP_NUM_THREADS), the client (asyncio + "
             f"{'raw streams' if (d.get('heads') or {}).get('client') == 'raw' else 'httpx'}) in the "
             f"benchmark's process on the same cores. Each part: its command, date, threads, repeats (figures are the "
             f"median of the repeats; latency percentiles pool every request of every repeat).", ""]
    h = d.get("heads")
    if h:
        lines += ["## 1. Heads on one frozen pass vs one process per head", "",
                  f"`{h['command']}` ({h['date']}; {h['threads']} thread(s) per server, {h['repeats']} repeat(s), up to "
                  f"{h['requests']} requests or {h['seconds']} s per configuration, {h['clients']} concurrent clients, "
                  f"after {h.get('warm_requests', 2 * h['clients'])} warm-up requests per configuration; "
                  f"took {h['took_s']:.0f} s). One request = one text, classified by every task of the server; with 8 "
                  f"servers the client sends each text to all 8 at once and a request is done when all 8 answered. "
                  f"Texts: short = {h['texts']['short']}; long = {h['texts']['long']}. Heads, in the order the "
                  f"1/4/8-head servers take them: {', '.join(h['heads_in_order'])} ({h['models']['train_command']}).", "",
                  "| configuration | texts | requests/s | p50 ms | p95 ms | p99 ms | peak RSS MB (all servers) | "
                  "server CPU ms/request: event loop + batcher | client CPU ms/request | rows/batch | requests | errors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sorted(h["results"], key=lambda r: (r["texts"] != "short", r["config"])):
            lat = r["latency_ms"]
            lines.append(f"| {r['config']} | {r['texts']} | {_f(r.get('requests_per_s'))} | {_f(lat['p50'])} | "
                         f"{_f(lat['p95'])} | {_f(lat['p99'])} | {_f(r.get('peak_rss_total_mb'), ',.0f')} | "
                         f"{_f(r.get('server_loop_cpu_ms_per_request'), '.2f')} + {_f(r.get('server_batcher_cpu_ms_per_request'), '.2f')} | "
                         f"{_f(r.get('client_cpu_ms_per_request'), '.2f')} | {_f(r.get('rows_per_batch'), '.1f')} | "
                         f"{r['requests']:,} | {r['errors']} |")
        lines += ["", "Server CPU: the main thread (uvicorn's event loop: HTTP, JSON, validation, tokenising) + the "
                  "other threads (the batcher: the backbone pass, the heads, each row's answer), per answered request "
                  "(summed over the servers of a configuration). Client CPU: this process (asyncio + "
                  f"{'raw streams, --client raw' if h.get('client') == 'raw' else 'httpx'}), on the same cores.", ""]
        for ts, q in h["ratios"].items():
            lines.append(f"- {ts}: 8 heads / 1 head requests/s {_goal(q['8_heads_vs_1_head_requests_per_s'], '>= 0.9')}; "
                         f"RSS {_goal(q['8_heads_vs_1_head_rss'], '<= 1.1')}"
                         + (f"; 8 heads in one server / 8 one-head servers: requests/s "
                            f"{q['8_heads_vs_8_servers_requests_per_s']:.2f}x, the 8 servers' total RSS "
                            f"{q['8_servers_vs_8_heads_total_rss']:.2f}x the one server's." if "8_heads_vs_8_servers_requests_per_s" in q
                            else " (--heads-core: the 1- and 8-head servers and their twins only)."))
            if "8_heads_vs_1_head_requests_per_s_pipeline_off" in q and str(m.get("device")).startswith("cuda"):
                lines.append(f"- {ts}: on a GPU `--pipeline auto` is off (serve/models.py pipeline_choice), so the "
                             f"default servers and their `--pipeline off` twins ran the same configuration: 8 heads / "
                             f"1 head from the twins {q['8_heads_vs_1_head_requests_per_s_pipeline_off']:.2f}x; the "
                             f"8-head twins' requests/s differ by {q['8_heads_pipeline_on_vs_off_requests_per_s']:.2f}x, "
                             f"which is this run's spread between identical servers.")
            elif "8_heads_vs_1_head_requests_per_s_pipeline_off" in q:
                lines.append(f"- {ts}: with every batch's heads after its pass (`--pipeline off`, the servers of the "
                             f"same run): 8 heads / 1 head requests/s {q['8_heads_vs_1_head_requests_per_s_pipeline_off']:.2f}x; "
                             f"the 8-head server's requests/s with the heads beside the next pass / after it: "
                             f"{q['8_heads_pipeline_on_vs_off_requests_per_s']:.2f}x. Server CPU per request, 8 heads / "
                             f"1 head (default servers): {q['8_heads_vs_1_head_server_cpu_per_request']:.2f}x: what the "
                             f"8 heads cost in CPU, which a second core now absorbs.")
            for k in q:
                if k.startswith("8_heads_default_vs_"):
                    t = h.get("twin_args", "?")
                    tk = k[len("8_heads_default_vs_"):-len("_requests_per_s")]
                    lines.append(f"- {ts}: the twins with `{t}` (the servers of the same run): 8 heads / 1 head requests/s "
                                 f"{q[f'8_heads_vs_1_head_requests_per_s_{tk}']:.2f}x; default / `{t}`: 8 heads "
                                 f"{q[k]:.2f}x, 1 head {q[f'1_head_default_vs_{tk}_requests_per_s']:.2f}x.")
            if "light_heads_vs_1_head_requests_per_s" in q:
                lines.append(f"- {ts}: {len(LIGHT)} heads without the self-explaining ones / 1 head requests/s "
                             f"{q['light_heads_vs_1_head_requests_per_s']:.2f}x, RSS {q['light_heads_vs_1_head_rss']:.2f}x "
                             f"(not the goal's configuration: the same ratio where every head is light).")
        hc = h.get("head_costs")
        if hc:
            names = list(next(iter(hc["texts"].values()))["heads_ms"])
            lines += ["", f"Where a batch's time goes in the 8-head server (the server's code in the benchmark's process, "
                      f"{hc['threads']} thread(s), one batch of {hc['rows']} texts, ms): the shared pass, the layer "
                      f"selections (one per layer choice), each head (the head and its rows' answers), and the "
                      f"server's whole call for the batch (FrozenPass.run).", "",
                      "| texts | batch (rows × tokens) | pass | layer selection | " + " | ".join(names)
                      + " | all heads | whole batch |",
                      "|---|---|---:|---:|" + "---:|" * (len(names) + 2)]
            for ts, row in hc["texts"].items():
                lines.append(f"| {ts} | {row['tokens'][0]} × {row['tokens'][1]} | {row['pass_ms']:.1f} | "
                             f"{_f(row.get('select_ms'))} | " + " | ".join(f"{row['heads_ms'][n]:.1f}" for n in names)
                             + f" | {row['heads_total_ms']:.1f} | {_f(row.get('group_run_ms'))} |")
            lines.append("")
        groups = {k: len(v["groups"]) for k, v in h["servers"].items() if k.startswith("heads")}
        lines += [f"- Pass groups per server (one = one backbone pass per batch for every head): "
                  f"{', '.join(f'{k}: {v}' for k, v in groups.items())}. Head test accuracy on SST-2 (trained on 1,500 "
                  f"examples): " + ", ".join(f"{k} {v['test_accuracy']:.1f}" for k, v in h["models"]["heads"].items())
                  + ".", ""]
    b = d.get("batching")
    if b:
        res = b["results"]
        off = res["batching-off"]
        lines += ["## 2. Batching across requests", "",
                  f"`{b['command']}` ({b['date']}; {b['threads']} thread(s), {b['repeats']} repeat(s), {b['clients']} "
                  f"clients, {b['texts']}; took {b['took_s']:.0f} s). One head ({HEADS[0][0]}); batching off = "
                  f"`--batch-tokens 1` ({b['batch_tokens_1_means']}).", "",
                  "| server | requests/s | p50 ms | p95 ms | p99 ms | rows/batch | server event loop CPU ms/request | "
                  "server batcher CPU ms/request | client CPU ms/request | server CPU share | client CPU share |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in res.items():
            lat = r["latency_ms"]
            lines.append(f"| {name} | {_f(r.get('requests_per_s'))} | {_f(lat['p50'])} | {_f(lat['p95'])} | {_f(lat['p99'])} | "
                         f"{_f(r.get('rows_per_batch'), '.1f')} | {_f(r.get('server_loop_cpu_ms_per_request'), '.2f')} | "
                         f"{_f(r.get('server_batcher_cpu_ms_per_request'), '.2f')} | {_f(r.get('client_cpu_ms_per_request'), '.2f')} | "
                         f"{_f(r.get('server_cpu_share'), '.2f')} | {_f(r.get('client_cpu_share'), '.2f')} |")
        hf = b["hf_loop"]
        lines += ["", f"- default / off: {_goal(b['default_vs_off_requests_per_s'], b['goal'])}."]
        if "packed_vs_padded_requests_per_s" in b:
            p_ = res[PADDED]["requests_per_s"] / off["requests_per_s"]
            lines += [f"- The default runs its pass packed (extract/packed.py: linear layers on the real tokens only). "
                      f"Packed / padded pass, both batched: {b['packed_vs_padded_requests_per_s']:.2f}x; batching with "
                      f"the padded pass / off: {p_:.2f}x."]
        lines += ["",
                  f"Plain Hugging Face loop in the benchmark's process ({hf['model']}, tokenizer + model under no_grad, "
                  f"max_length {hf['max_length']}, {hf['threads']} thread(s); bf16 = the server's pass: bf16 Linear "
                  f"weights under autocast, frozentune's `prepare`):", "",
                  "| precision | batch | texts/s |", "|---|---:|---:|"]
        lines += [f"| {r['precision']} | {r['batch']} | {_f(r.get('texts_per_s'))} |" for r in hf["rows"]]
        d_, off = res["batching-default"], res["batching-off"]
        best = max((r for r in hf["rows"] if r["precision"] == "bf16"), key=lambda r: r["texts_per_s"])
        one_row = next((r for r in hf["rows"] if r["precision"] == "bf16" and r["batch"] == 1), None)
        lines += ["", f"- What bounds the server: the default server answered {d_['requests_per_s']:,.1f} requests/s, "
                  f"{d_['requests_per_s'] / best['texts_per_s']:.2f}x the plain bf16 loop's best "
                  f"({best['texts_per_s']:,.1f} texts/s at batch {best['batch']}, {1000 / best['texts_per_s']:.2f} ms a "
                  f"text; batch 1: " + (f"{1000 / one_row['texts_per_s']:.2f} ms" if one_row else "–") + "). Per request "
                  f"its batcher thread (pass, head, answer) used {_f(d_.get('server_batcher_cpu_ms_per_request'), '.2f')} ms "
                  f"of CPU at {_f(d_.get('rows_per_batch'), '.1f')} rows a batch ({_f(off.get('server_batcher_cpu_ms_per_request'), '.2f')} "
                  f"ms with batching off) and its event loop (HTTP, JSON, validation, tokenising) "
                  f"{_f(d_.get('server_loop_cpu_ms_per_request'), '.2f')} ms, which batching cannot shrink; the client used "
                  f"{_f(d_.get('client_cpu_ms_per_request'), '.2f')} ms per request on the same cores. CPU used, in cores: "
                  f"server {_f(d_.get('server_cpu_share'), '.2f')}, client {_f(d_.get('client_cpu_share'), '.2f')} (of "
                  f"{m.get('cores')}).", ""]
    g = d.get("generation")
    if g:
        by = g.get("precisions") or {"fp32": g}  # files written before --gen-precisions: one fp32 server
        lines += ["## 3. Generation: 8 prefixes on SmolLM2-135M in one server", "",
                  f"`{g['command']}` ({g['date']}; {g['threads']} thread(s), {g['repeats']} repeat(s), up to "
                  f"{g['gen_requests']} requests or {g['gen_seconds']} s per mode; took {g['took_s']:.0f} s). Prefixes: "
                  f"the LM's keys/values on {len(g['prefixes']['phrases'])} phrases (init=words, untrained; "
                  f"`{g['prefixes']['generate_check']['command']}` loads one: {g['prefixes']['generate_check']['output']}). "
                  f"Sources: {g['sources']}; greedy, max_new_tokens {g['decoding']['max_new_tokens']}, min_new_tokens "
                  f"{g['decoding'].get('min_new_tokens', 0)}; one source per request; tokens from the replies' `tokens`."
                  + (" One server per decoding precision (`--precision`), one after the other." if len(by) > 1 else ""), "",
                  "| precision | mode | tokens/s | requests/s | tokens/request | p50 ms | p95 ms | rows/batch | tokens | "
                  "requests | errors |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for prec, gp in by.items():
            for mode, r in gp["results"].items():
                lines.append(f"| {prec} | {mode} | {_f(r.get('tokens_per_s'))} | {_f(r.get('requests_per_s'), '.2f')} | "
                             f"{_f(r.get('tokens_per_request'), '.1f')} | "
                             f"{_f(r.get('latency_ms')['p50'], ',.0f')} | {_f(r.get('latency_ms')['p95'], ',.0f')} | "
                             f"{_f(r.get('rows_per_batch'), '.1f')} | {r['tokens']:,} | {r['requests']:,} | {r['errors']} |")
        lines.append("")
        for prec, gp in by.items():
            sc = gp["same_output_check"]
            lines += [f"- {prec}: mixed / one prefix: {_goal(gp['mixed_vs_one_prefix'], '>= 0.9')}; mixed / one at a "
                      f"time: {_goal(gp['mixed_vs_one_at_a_time'], '>= 4')}"
                      + (f"; 16 clients on the 8 prefixes (the library's batch of 16) / one at a time: "
                         f"{gp['mixed16_vs_one_at_a_time']:.2f}x" if gp.get("mixed16_vs_one_at_a_time") else "") + ". "
                      f"The same (prefix, source) answered in different batches gave different text for "
                      f"{sc['pairs_with_differing_outputs']} of {sc['pairs_seen_more_than_once']} pairs."]
        if len(by) > 1 and "fp32" in by:
            base = by["fp32"]["results"]
            for prec, gp in by.items():
                if prec != "fp32":
                    lines.append(f"- {prec} / fp32 tokens/s, same run: " + ", ".join(
                        f"{mode} {r['tokens_per_s'] / base[mode]['tokens_per_s']:.2f}x"
                        for mode, r in gp["results"].items() if base.get(mode, {}).get("tokens_per_s")) + ".")
        if g["decoding"].get("min_new_tokens") != g["decoding"]["max_new_tokens"]:
            lines.append("- Rows stop at their end-of-text token, so prefixes that end sooner give fewer tokens per "
                         "request while their batch decodes as long as its longest row: see tokens/request.")
        lines.append("")
    bad = d.get("bad")
    if bad:
        lines += ["## 4. Bad requests", "", f"`{bad['command']}` ({bad['date']}). One server: "
                  f"{', '.join(bad['server']['tasks'])}. After every case GET /health is sent; "
                  f"`{{error}}` = the body is exactly {{\"error\": message}}. Server alive at the end: "
                  f"{'yes' if bad['server_alive_at_end'] else 'NO'}.", "",
                  "| case | request | status | {error} | message | ms | /health after |", "|---|---|---:|---|---|---:|---|"]
        for r in bad["rows"]:
            msg = str(r["message"]).replace("|", "\\|").replace("\n", " ")
            msg = msg if len(msg) <= 220 else msg[:217] + "…"
            lines.append(f"| {r['case']} | {r['method']} {r['path']} ({r['body_bytes']:,} B) | {r['status']} | "
                         f"{'–' if r['status'] == 200 else 'yes' if r['error_shape'] else 'no'} | {msg} | {r['ms']:,.0f} | {r['health_after']} "
                         f"({r['health_ms']:.0f} ms) |")
        lines.append("")
    s = d.get("soak")
    if s:
        w, m = s.get("warm_up") or {}, s["rss_mb"]
        before = (f"after a warm-up of {w['seconds']:.0f} s in the same traffic ({w['answered_ok']:,} answered, "
                  f"{w['errors']} errors)" if w else "with no warm-up in the same traffic")
        lines += ["## 5. Soak", "", f"`{s['command']}` ({s['date']}; {s['threads']} thread(s); allocator: "
                  f"{s.get('allocator', 'glibc malloc')}). 8-head server, short "
                  f"texts, open loop at {s['target_requests_per_s']:,.1f} requests/s ({s['load']:.0%} of "
                  f"{s['capacity_requests_per_s']:,.1f}, from {s['capacity_from']}) for {s['soak_seconds']:.0f} s, "
                  f"{before}. Requests sent late by the client's "
                  f"scheduler (> 50 ms): {s['client_late_over_50ms']:,} (worst {s['client_late_max_s']:.2f} s).", "",
                  "| scheduled | answered | achieved req/s | errors | dropped by client | p50 ms | p99 ms | RSS start MB | "
                  "RSS end MB | RSS max MB | growth | after the first 10% | over the second half |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {s['scheduled']:,} | {s['answered_ok']:,} | {s['achieved_requests_per_s']:,.1f} | {s['errors']} | "
                  f"{s['dropped_by_client']} | {_f(s['latency_ms']['p50'])} | {_f(s['latency_ms']['p99'])} | "
                  f"{m['start']:,.0f} | {m['end']:,.0f} | {m['max']:,.0f} | "
                  f"{s['rss_growth_pct']:+.2f}% | {_f(s.get('rss_growth_after_first_10pct'), '+.2f%')} | "
                  f"{_f(s.get('rss_growth_second_half_pct'), '+.2f%')} |", ""]
        if "idle" in m:
            lines += [f"Memory from the server's start: {m['idle']:,.0f} MB loaded and idle, {m['first_request']:,.0f} MB "
                      f"at the first open-loop request, {m['start']:,.0f} MB at the soak's first, {m['end']:,.0f} MB at "
                      f"its end: {s['rss_growth_from_first_request_pct']:+.2f}% from the first open-loop request.", ""]
        if w:
            lines.append("Warm-up RSS every 10 s (s, MB): " + ", ".join(f"{t:.0f}: {v:,.0f}" for t, v in w["rss_series_mb"]))
            lines.append("")
        lines += ["Soak RSS every 10 s (s, MB): " + ", ".join(f"{t:.0f}: {v:,.0f}" for t, v in s["rss_series_mb"]), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
async def run(a, parts: list[str], data: dict, command: str, stopped: dict) -> None:
    import httpx

    # Ctrl-C and SIGTERM cancel this task: every part's `finally` stops its servers (a signal that
    # arrives during a blocking step, e.g. training a head, is acted on when that step returns)
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (stopped.setdefault("signal", sig), task.cancel()))

    logdir = a.models.parent / "serve-logs"  # the servers' output, one file each
    logdir.mkdir(parents=True, exist_ok=True)
    heads_dir, gen_dir = a.models / "heads", a.models / "generation"
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16, keepalive_expiry=2.0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(120.0), trust_env=False) as client:
        models = train_heads(heads_dir) if any(p in parts for p in ("heads", "batching", "bad", "soak")) else None
        for part in parts:
            t0 = time.perf_counter()
            log(f"== {part}")
            Server.exit_codes.clear()
            if part == "heads":
                out = await part_heads(a, client, heads_dir, logdir)
                out["models"] = models
            elif part == "batching":
                out = await part_batching(a, client, heads_dir, logdir)
            elif part == "generation":
                out = await part_generation(a, client, gen_dir, logdir)
            elif part == "bad":
                out = await part_bad(a, client, heads_dir, gen_dir, logdir)
            else:
                out = await part_soak(a, client, heads_dir, logdir, data.get("heads"))
            out["server_exit_codes"] = dict(Server.exit_codes)  # 143: stopped by SIGTERM (the CLI's code for it)
            Server.exit_codes.clear()
            out = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "threads": a.threads,
                   "repeats": a.repeats, "requests": a.requests, "seconds": a.seconds, "clients": a.clients, "client": a.client, "warm_requests": a.warm_requests,
                   "gen_requests": a.gen_requests, "gen_seconds": a.gen_seconds,
                   "took_s": round(time.perf_counter() - t0, 1), **out}
            data[part] = out
            save(a.output, data)
            log(f"== {part} took {out['took_s']:.0f}s")


def save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, allow_nan=False))
    path.with_suffix(".md").write_text(report(data) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="requests per configuration (classification)")
    ap.add_argument("--seconds", type=float, default=30.0, help="cap in seconds per configuration (classification)")
    ap.add_argument("--repeats", type=int, default=2, help="each configuration measured this many times, interleaved")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients for classification")
    ap.add_argument("--warm-requests", type=int, default=640,
                    help="heads part: requests sent to each configuration before its first measured repeat, not "
                         "counted (was 2 × --clients = 64 until 2026-11-25: the 8-head server's first repeat was then "
                         "the low one in three runs out of three)")
    ap.add_argument("--gen-requests", type=int, default=96, help="generation requests per mode")
    ap.add_argument("--gen-seconds", type=float, default=45.0, help="cap in seconds per generation mode")
    ap.add_argument("--gen-new-tokens", type=int, default=32, help="max_new_tokens of every generation request")
    ap.add_argument("--gen-precisions", default="fp32,bf16", help="generation: one server per --precision, in turn")
    ap.add_argument("--gen-min-new-tokens", type=int, default=None,
                    help="min_new_tokens of every generation request (default: --gen-new-tokens, i.e. every row "
                         "decodes exactly that many tokens; 0: rows stop at their end-of-text token)")
    ap.add_argument("--only", default=None, help=f"comma list of parts: {', '.join(PARTS)} (default: all but soak; "
                                                 f"soak too when --soak is given)")
    ap.add_argument("--device", default=None, help="every server's --device (and the plain HF loop's, the head costs'); "
                                                  "default: the server's own default (auto)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every server and of the plain HF loop")
    ap.add_argument("--client", choices=("httpx", "raw"), default="httpx",
                    help="the load generator of the classify parts: httpx (every run until 2026-11-26) or raw "
                         "(RawClients: asyncio streams, about a ninth of httpx's CPU per request)")
    ap.add_argument("--soak", type=float, default=0.0, metavar="SECONDS", help="soak length (0: no soak; full run: 600)")
    ap.add_argument("--soak-load", type=float, default=0.8, help="soak rate as a share of the 8-head capacity")
    ap.add_argument("--soak-warm", type=float, default=60.0, metavar="SECONDS",
                    help="before the soak, this long in the soak's own traffic (0: none); memory is reported from "
                         "both starts")
    ap.add_argument("--twin-args", default="--pipeline off",
                    help="heads part: the options of the 1- and 8-head twin servers beside the default ones, e.g. "
                         "'--cuda-graphs off' on a GPU (where --pipeline auto is already off)")
    ap.add_argument("--heads-core", action="store_true",
                    help="heads part: only the 1- and 8-head servers and their twins (the 8/1 ratio), not the 4-head, "
                         "light and 8 one-head servers: more repeats of the goal's ratio in the same time")
    ap.add_argument("--soak-server-args", default="", help="more options for the soak's server, e.g. '--pipeline off'")
    ap.add_argument("--soak-rate", type=float, default=None, help="soak capacity in requests/s (default: the JSON's "
                                                                  "heads part with the same --threads, else measured)")
    ap.add_argument("--models", type=Path, default=MODELS, help="where the heads and prefixes are made and reused")
    ap.add_argument("--output", type=Path, default=HERE / "results" / "serve_load.json")
    ap.add_argument("--report", action="store_true", help="only rewrite the .md from the .json")
    a = ap.parse_args()
    data = json.loads(a.output.read_text()) if a.output.is_file() else {}
    if a.report:
        a.output.with_suffix(".md").write_text(report(data) + "\n")
        return 0
    parts = [p.strip() for p in a.only.split(",")] if a.only else [p for p in PARTS if p != "soak" or a.soak > 0]
    bad = [p for p in parts if p not in PARTS]
    if bad or ("soak" in parts and a.soak <= 0):
        ap.error(f"--only: unknown part(s) {bad}" if bad else "--only soak needs --soak SECONDS")
    if min(a.requests, a.clients, a.repeats, a.gen_requests, a.threads) < 1 or min(a.seconds, a.gen_seconds) <= 0:
        ap.error("--requests, --clients, --repeats, --gen-requests, --threads must be ≥ 1 and the seconds > 0")
    if a.gen_min_new_tokens is None:
        a.gen_min_new_tokens = a.gen_new_tokens
    if not 0 <= a.gen_min_new_tokens <= a.gen_new_tokens:
        ap.error("--gen-min-new-tokens: from 0 to --gen-new-tokens")
    import torch
    Server.common = ["--device", a.device] if a.device else []
    data["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "python": sys.version.split()[0], "device": a.device or "server default",
                       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    command = "python bench/serve_load.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    t0 = time.perf_counter()
    stopped: dict = {}
    try:
        asyncio.run(run(a, parts, data, command, stopped))
    except (KeyboardInterrupt, asyncio.CancelledError):
        sig = stopped.get("signal", signal.SIGINT)
        log(f"interrupted by {signal.Signals(sig).name}: servers stopped; finished parts are in {a.output}")
        return 128 + int(sig)
    finally:
        stop_all()
    log(f"done in {time.perf_counter() - t0:.0f}s: {a.output} and {a.output.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
