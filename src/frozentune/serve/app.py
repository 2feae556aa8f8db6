"""The HTTP API over an Engine (FastAPI on uvicorn): JSON endpoints described by OpenAPI
(/openapi.json, /docs), Prometheus metrics, the page, and a bad request answered with a 4xx and a
message while the server goes on serving.

  GET  /                 the page (page.html)
  GET  /docs             the API: Swagger UI, or offline the same listed from /openapi.json (docs.html)
  GET  /health           {"status": "ok", ..., "task_failures": {task: texts it failed on}}
  GET  /v1/models        the served tasks, the batching options and the memory allocator
  POST /v1/classify      {"texts": [...] | "text": "..." | "pairs": [[a, b], ...] | "pair": [a, b],
                         "tasks": [...]?, "explain": false, "top": 5}   (pairs: for tasks trained on pairs)
  POST /v1/explain       the same, explanations on, only tasks that explain
  POST /v1/generate      {"prefix": "name", "sources": [...] | "source": "...", "num_beams"?, "max_new_tokens"?}
  GET  /metrics          Prometheus text format

Every error is {"error": message} with its status: 400 malformed JSON, 404 unknown task, 413 too
many texts or too long a source, 415 a body not sent as JSON (Content-Type), 422 a field of the wrong
type or value, 503 + Retry-After when the queue is full or the server is stopping, 500 when a batch
failed (its message). A classify task that fails on a batch (its head raised) fails alone, and one
whose scores for a text were not numbers fails on that text alone: a request with other tasks or texts
answered gets 200, the failed entries {"error": message} in their places and "failed": {task: message};
a request with nothing answered gets the 500. Each failure is logged (a line per task a minute at most)
and counted: frozentune_task_failures_total{task} in /metrics, task_failures in /health.
"""
from __future__ import annotations

import asyncio
import contextlib
import email.message
import errno
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import Request  # at module level: FastAPI resolves a route's string annotations in these globals
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from .batcher import BatchStats, Overloaded
from .engine import Engine, RequestError
from .models import ServeError, TaskFailed

PAGE = Path(__file__).with_name("page.html")
DOCS = Path(__file__).with_name("docs.html")


def docs_html() -> str:
    """/docs: Swagger UI from the CDN FastAPI's own /docs uses, and where the browser cannot reach it
    (offline, a closed network: FastAPI's page is then blank), the same API listed from /openapi.json."""
    import inspect
    from urllib.parse import urlsplit

    from fastapi.openapi.docs import get_swagger_ui_html

    given = inspect.signature(get_swagger_ui_html).parameters
    js, css = given["swagger_js_url"].default, given["swagger_css_url"].default
    return (DOCS.read_text(encoding="utf-8").replace("{js}", js).replace("{css}", css)
            .replace("{host}", urlsplit(js).hostname or js))


OCCLUSION = ("also cut each word out of the text in turn and list the words whose removal lowers the predicted "
             "label's probability most (explanation.occlusion: drop and the probability without the word; one more "
             "row per word), for any task: what the prediction depends on, where a head's own explanation is a "
             "quantity inside it")
TOP_CLASSES = ("keep each task's K likeliest classes in its scores, likeliest first, and in its explanation's per-class "
               "parts (default: every class, in label order)")


class Classify(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] | None = Field(None, description="texts to classify (or `text` for one)")
    text: str | None = None
    pairs: list[list[str]] | None = Field(None, description="sentence pairs [first, second] for tasks trained on "
                                          "pairs (or `pair` for one)")
    pair: list[str] | None = None
    tasks: list[str] | None = Field(None, description="task names (default: every classification task)")
    explain: StrictBool = Field(False, description="add each task's explanation where its method gives one (where it gives none: "
                                                  "explanation null and a line saying so)")
    top: StrictInt = Field(5, description="explanations: how many tokens or spans")
    occlusion: StrictBool = Field(False, description=OCCLUSION + "; needs explain")
    top_classes: StrictInt | None = Field(None, description=TOP_CLASSES)


class Explain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] | None = None
    text: str | None = None
    pairs: list[list[str]] | None = None
    pair: list[str] | None = None
    tasks: list[str] | None = Field(None, description="task names (default: every task that explains; with "
                                    "occlusion, every classification task)")
    top: StrictInt = 5
    occlusion: StrictBool = Field(False, description=OCCLUSION)
    top_classes: StrictInt | None = Field(None, description=TOP_CLASSES)


class Generate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str = Field(..., description="the generation task (its folder's name)")
    sources: list[str] | None = None
    source: str | None = None
    num_beams: StrictInt | None = Field(None, description="default: as the model was trained")
    max_new_tokens: StrictInt | None = None
    min_new_tokens: StrictInt = Field(0, description="no end-of-text before this many new tokens")


class ErrorBody(BaseModel):
    """Every error's body, whatever its status."""
    error: str = Field(..., description="what is wrong and what to do, in one line")


# The statuses the API answers with, as its OpenAPI description lists them (FastAPI's own 422
# `{"detail": [...]}` is replaced by these: every error is {"error": message})
ERRORS = {
    400: "the body is not valid JSON, or cannot be read",
    404: "an unknown task or prefix, or no such endpoint",
    413: "too many texts in one request, or a source too long for the language model",
    415: "a body not sent as JSON (Content-Type)",
    422: "a field of the wrong type or value (an empty text, top out of range, ...)",
    500: "a batch failed, or every task the request asked for did (its message, naming each task)",
    503: "the queue is full, or the server is stopping; try again after Retry-After seconds",
}


def _responses(ok: str, example: dict) -> dict:
    """A POST endpoint's documented answers: 200 (what it holds, with an example) and every error status."""
    out: dict = {200: {"description": ok, "content": {"application/json": {"example": example}}}}
    for status, why in ERRORS.items():
        out[status] = {"model": ErrorBody, "description": why}
    out[503]["headers"] = {"Retry-After": {"description": "seconds to wait before trying again",
                                           "schema": {"type": "integer"}}}
    return out


_LABELLED = {"label": "positive", "scores": {"negative": 0.08, "positive": 0.92}}
_CLASSIFIED = {"tasks": ["sst2-probe"], "results": [{"chars": 27, "truncated": False,
                                                      "tasks": {"sst2-probe": _LABELLED}}]}
_EXPLAINED = {"tasks": ["sst2-se"], "results": [{"chars": 27, "truncated": False, "tasks": {"sst2-se": {
    **_LABELLED, "explanation": {"spans": [{"text": "a gorgeous, witty film", "start": 0, "end": 22, "weight": 0.41}]},
    "lines": ['0.41 "a gorgeous, witty film"']}}}]}
_GENERATED = {"prefix": "e2e", "num_beams": 1, "max_new_tokens": 64, "outputs": [
    {"source": "name[Aromi], food[Italian]", "output": "Aromi serves Italian food.", "tokens": 6, "truncated": False}]}


def _inputs(body: Any) -> tuple[list, bool, str]:
    """(the request's texts or pairs, whether pairs, the field they came in): exactly one of texts,
    text, pairs, pair."""
    given = [k for k in ("texts", "text", "pairs", "pair") if getattr(body, k) is not None]
    if len(given) != 1:
        raise RequestError("give one of 'texts' (a list), 'text' (one string), 'pairs' (a list of [first, second]) "
                           "or 'pair' ([first, second]), not " + (" and ".join(given) if given else "none"))
    k = given[0]
    value = getattr(body, k)
    return ([value] if k in ("text", "pair") else value), k in ("pairs", "pair"), k


def _no_query(request: Request) -> None:
    """A POST's query string (`?tasks=a&explain=true`) was ignored without a word, while an unknown body field is
    refused: refused too, naming where the fields go."""
    if request.url.query:
        raise RequestError(f"?{request.url.query[:80]}: query parameters are not read; put the fields in the JSON "
                           f"body (see /docs)", 422)


def _one(body: Any, many: str, one: str) -> tuple[list, str]:
    """(the request's list, the field it came in): exactly one of `many` (a list) and `one`."""
    given = [k for k in (many, one) if getattr(body, k) is not None]
    if len(given) != 1:
        raise RequestError(f"the body has both {many!r} and {one!r}; give one of them" if given else
                           f"the body has no {one!r} (one string) or {many!r} (a list); give one of them")
    return (getattr(body, many), many) if given[0] == many else ([getattr(body, one)], one)


@contextmanager
def _as_sent(field: str):
    """A request that sent one item (`text`, `pair`, `source`) is answered about that field: the
    engine checks lists, and would name `texts[0]` (or `pairs[0]`, `sources[0]`), which it never sent."""
    many = {"text": "texts", "pair": "pairs", "source": "sources"}.get(field)
    try:
        yield
    except RequestError as e:
        said = str(e)
        if many is None or not said.startswith(f"{many}[0]"):
            raise
        raise RequestError(field + said[len(many) + 3:], e.status) from None


def _validation_message(errors: list[dict]) -> tuple[int, str]:
    """A RequestValidationError's errors as (status, one line)."""
    for e in errors:
        if e.get("type") == "json_invalid":
            return 400, f"the body is not valid JSON ({e.get('ctx', {}).get('error', e.get('msg'))}); send a JSON object"
        if e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",):  # nothing was sent
            return 400, "the body is empty; send a JSON object"
    parts = []
    for e in errors[:3]:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        where = "".join(f"[{x}]" if x.isdigit() else f".{x}" for x in loc).lstrip(".") or "the body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return 422, "; ".join(parts) + ("" if len(errors) <= 3 else f" (and {len(errors) - 3} more)")


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (application/json or */*+json)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _not_json_message(content_type: str | None) -> str:
    """What to tell a client whose body FastAPI did not read as JSON, for its Content-Type."""
    sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
    return f"the body was sent with {sent}; send a JSON object with Content-Type: application/json"


def _unreadable(cause: BaseException | None, encoding: str | None) -> tuple[int, str]:
    """A body that could not be parsed (FastAPI's 400), as (status, message) by what went wrong under it."""
    from starlette.requests import ClientDisconnect

    if isinstance(cause, ClientDisconnect):  # nobody reads it: the status is for /metrics (was counted a 400)
        return 499, "the client disconnected before its whole body was sent"
    if encoding and encoding.strip().lower() != "identity":
        return 415, (f"the body was sent with Content-Encoding {encoding!r}; compressed bodies are not read: send the "
                     f"JSON object uncompressed")
    if isinstance(cause, RecursionError):
        return 400, "the body's JSON is nested too deeply to read; send a JSON object nested a few levels at most"
    if isinstance(cause, UnicodeDecodeError):
        return 400, (f"the body could not be read: not UTF-8 (byte 0x{cause.object[cause.start:cause.start + 1].hex()} "
                     f"at offset {cause.start:,}); send a JSON object encoded as UTF-8")
    if isinstance(cause, ValueError) and "digits" in str(cause):  # Python's int-from-text limit (set_int_max_str_digits)
        return 400, f"the body's JSON has a number too long to read ({cause}); send numbers of a few digits"
    return 400, "the body could not be read (not UTF-8 JSON?); send a JSON object"


# Retry-After of a request cut off at shutdown: the server is going away, so no queue rate says when it is
# back; a client that retries at once reaches its replacement, or is told the port is closed
RETRY_AFTER_SHUTDOWN = "1"


class Counting:
    """ASGI middleware: each HTTP request's endpoint, status and time into the Prometheus metrics.
    Plain ASGI, not Starlette's BaseHTTPMiddleware (`@app.middleware("http")`), which ran every
    request through a task group and a response stream: the most time under the GIL of the server's
    event loop in a profile of 32 clients (py-spy), on the thread the batcher shares the GIL with."""

    def __init__(self, app, requests, latency, on_cut: Callable[[int], None] | None = None):
        self.app, self.requests, self.latency, self.on_cut = app, requests, latency, on_cut
        self.cut = 0  # requests cancelled before they were answered (the grace period at shutdown ran out)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.perf_counter(), [500]  # 500 unless a response starts (an unhandled error)
        started = [False]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0], started[0] = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:  # uvicorn cancels what runs past its graceful-shutdown timeout
            self.cut += 1
            if self.on_cut is not None:
                self.on_cut(self.cut)
            if started[0]:
                raise  # part of an answer went out: nothing cleaner can follow it
            # a JSON 503 in place of the server's plain-text 500, where the client still listens, and the request
            # ends here: re-raised, uvicorn logged ~45 lines of traceback for each one (the exit line counts them)
            status[0] = 503
            body = json.dumps({"error": "the server is shutting down and this request was still running when "
                                        "its grace period ended (serve --shutdown-grace); send it again to a "
                                        "running server"}).encode()
            with contextlib.suppress(Exception):  # Retry-After, as every 503 of this API has (a restarted server)
                await send({"type": "http.response.start", "status": 503, "headers": [
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"retry-after", RETRY_AFTER_SHUTDOWN.encode())]})
                await send({"type": "http.response.body", "body": body})
        finally:
            endpoint = getattr(scope.get("route"), "path", "other")
            self.requests.labels(endpoint, str(status[0])).inc()
            self.latency.labels(endpoint).observe(time.perf_counter() - start)


class ClientGone(Exception):
    """The client of a request disconnected before its answer (answered 499, which nobody reads)."""


async def unless_gone(request, work: Awaitable):
    """`work`'s result, or ClientGone once the request's client disconnects: the work is then cancelled, so
    its rows still queued are dropped, and a decode under way stops at its next token once every request
    with a row in it is gone (Engine._await, LMGroup.run).
    uvicorn does not cancel a handler whose client went away: a generate request of 64 sources × 8 beams
    was decoded whole for nobody, holding up the generation lane. For generate only: a classify request
    is over in milliseconds."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":  # the body was read: this waits for the end
            pass
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():  # cancelled for the client's leaving, not by the server
            raise ClientGone("the client disconnected before its answer; its queued rows were dropped") from None
        raise
    finally:
        watcher.cancel()


def create_app(engine: Engine, on_cut: Callable[[int], None] | None = None):
    """The FastAPI app serving `engine`; closing the app (lifespan end) closes the engine after
    the requests in flight are answered. on_cut(n): called as requests are cut off at shutdown
    (n so far)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from .allocator import in_use

    allocator = in_use()  # for /v1/models: system, tcmalloc or jemalloc (see allocator.py)
    registry = CollectorRegistry()
    requests = Counter("frozentune_requests", "HTTP requests answered", ["endpoint", "status"], registry=registry)
    latency = Histogram("frozentune_request_seconds", "time from request to answer", ["endpoint"], registry=registry,
                        buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
    rows = Histogram("frozentune_batch_rows", "rows (texts or sources) per batch", ["group"], registry=registry,
                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
    batch_seconds = Histogram("frozentune_batch_seconds", "time to run one batch", ["group"], registry=registry,
                              buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
    passes = Counter("frozentune_batches", "batches run (one backbone pass or decode each)", ["group"], registry=registry)
    Gauge("frozentune_queue_rows", "rows waiting for a batch", registry=registry).set_function(lambda: engine.batcher.depth)
    # a request answered 200 with a task failed in it was a plain 200 here: nothing showed a failing task
    failures = Counter("frozentune_task_failures", "texts (or sources) a task could not answer: its head raised, its "
                       "scores were not numbers, or its batch failed", ["task"], registry=registry)
    for name in engine.tasks:  # every series at 0 from the start, so that a rate over it has a first value
        failures.labels(name)
    engine.on_failure(lambda task, times: failures.labels(task).inc(times))

    def on_batch(s: BatchStats) -> None:
        rows.labels(s.group).observe(s.rows)
        batch_seconds.labels(s.group).observe(s.seconds)
        passes.labels(s.group).inc()

    engine.observe(on_batch)

    @asynccontextmanager
    async def lifespan(app):
        yield
        if app.state.stop_now:  # a second Ctrl-C: the process is going away now; a batch under way is not waited for
            return
        # uvicorn runs this after the requests in flight were answered, or cut off past the grace period; in a
        # thread, so that the event loop still sends the cut-off requests' 503s while a batch under way finishes
        await asyncio.to_thread(engine.close)

    app = FastAPI(title="frozentune serve", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Many tasks on one frozen backbone pass: classify, explain, generate.")
    app.state.stop_now = False  # set by _graceful_server on a second SIGINT

    app.add_middleware(Counting, requests=requests, latency=latency, on_cut=on_cut)

    def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        content_type = request.headers.get("content-type")
        if request.method == "POST" and not _is_json(content_type):  # FastAPI validated the raw bytes
            return error(415, _not_json_message(content_type))
        return error(*_validation_message(list(exc.errors())))

    @app.exception_handler(RequestError)
    async def bad(request: Request, exc: RequestError):
        return error(exc.status, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, exc: StarletteHTTPException):  # unknown path, wrong method, unreadable body
        detail, status = exc.detail if isinstance(exc.detail, str) else str(exc.detail), exc.status_code
        headers = getattr(exc, "headers", None)
        if status == 404:
            detail = f"no such endpoint {request.url.path}; see /docs"
        elif status == 405:  # e.g. a browser's GET of /v1/classify: "Method Not Allowed" said nothing more
            allowed = (headers or {}).get("Allow", "")
            detail = (f"{request.method} {request.url.path}: this endpoint takes {allowed or 'other methods'}"
                      + (" with a JSON body" if "POST" in allowed else "") + "; see /docs")
        elif status == 400 and "parsing the body" in detail:
            status, detail = _unreadable(exc.__cause__, request.headers.get("content-encoding"))
        return error(status, detail, headers)

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        return error(503, str(exc), {"Retry-After": str(exc.retry_after)})

    @app.exception_handler(TaskFailed)
    async def task_failed(request: Request, exc: TaskFailed):  # its message names each task and says why
        return error(500, str(exc))

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        return error(500, f"{type(exc).__name__}: {' '.join(str(exc).split())}")

    page_html = PAGE.read_text(encoding="utf-8")  # read once, with the app
    api_html = docs_html()

    # GET and HEAD: a load balancer's or uptime checker's HEAD / or HEAD /health was a 405 (HEAD is
    # left out of the OpenAPI description, where it would repeat GET's operation)
    @app.head("/", include_in_schema=False)
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(page_html)

    @app.head("/docs", include_in_schema=False)
    @app.get("/docs", response_class=HTMLResponse, include_in_schema=False)
    async def docs():
        return HTMLResponse(api_html)

    @app.head("/health", include_in_schema=False)
    @app.get("/health")
    async def health():
        return {"status": "ok", "tasks": len(engine.tasks), "queue_rows": engine.batcher.depth,
                "uptime_s": round(time.time() - engine.started, 1),
                "task_failures": dict(engine.failures.totals)}  # {task: texts it failed on}, the failing ones

    @app.head("/v1/models", include_in_schema=False)
    @app.get("/v1/models")
    async def models():
        o = engine.options
        return {"tasks": engine.describe(), "groups": [g.label for g in engine.groups], "allocator": allocator,
                "batching": {"batch_tokens": o.batch_tokens, "max_wait_ms": o.max_wait_ms, "max_queue": o.max_queue,
                             "max_texts": o.max_texts}}

    # The engine's answers hold JSON's own types only (str, float, int, bool, None, lists and dicts of them),
    # so they are rendered as they are: returned as a dict, FastAPI would first walk every value with
    # jsonable_encoder, 70 µs of the event loop per 8-task answer on this CPU against 14 µs for the rendering.
    @app.post("/v1/classify", response_class=JSONResponse, responses=_responses(
        "per text (or pair), in order: each task's label and probabilities (and, with explain, its explanation); "
        "`truncated` and a `note` where the input went on past max_length (its end was not read). A task that "
        "failed on its batch has {\"error\": message} in its place, and `failed` names it with its message (the "
        "others are answered)",
        _CLASSIFIED))
    async def classify(body: Classify, request: Request):
        _no_query(request)
        texts, pairs, field = _inputs(body)
        if "top" in body.model_fields_set and not body.explain:  # it was ignored: the answer had no explanations
            raise RequestError("'top' sets how many tokens or spans an explanation lists; add \"explain\": true "
                               "(or post to /v1/explain), or leave 'top' out", 422)
        with _as_sent(field):
            return JSONResponse(await engine.aclassify(texts, body.tasks, body.explain, body.top, pairs,
                                                       body.occlusion, body.top_classes))

    @app.post("/v1/explain", response_class=JSONResponse, responses=_responses(
        "as /v1/classify with explain: every task that explains, its label, probabilities and explanation "
        "(spans, tokens or attention, with character offsets)", _EXPLAINED))
    async def explain(body: Explain, request: Request):
        _no_query(request)
        texts, pairs, field = _inputs(body)
        with _as_sent(field):
            return JSONResponse(await engine.aexplain(texts, body.tasks, body.top, pairs, body.occlusion,
                                                      body.top_classes))

    @app.exception_handler(ClientGone)
    async def gone(request: Request, exc: ClientGone):  # nobody reads it: the status is for /metrics and the log
        return error(499, str(exc))

    @app.post("/v1/generate", response_class=JSONResponse, responses=_responses(
        "the prefix's output for each source, in order; `truncated` and a `note` where an encoder-decoder's "
        "source was longer than its encoder takes and its end was cut off (as `frozentune generate` cuts it)",
        _GENERATED))
    async def generate(body: Generate, request: Request):
        _no_query(request)
        sources, field = _one(body, "sources", "source")
        with _as_sent(field):
            return JSONResponse(await unless_gone(request, engine.agenerate(
                body.prefix, sources, body.num_beams, body.max_new_tokens, body.min_new_tokens)))

    @app.head("/metrics", include_in_schema=False)
    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def http_stack(find=importlib.util.find_spec) -> tuple[str, str, str]:
    """(HTTP parser, event loop, a note for the log) that uvicorn runs the server on: httptools and
    uvloop, dependencies of frozentune where they build (not Windows), else h11 and asyncio, said
    so. With both, the event loop took 0.77x the CPU per request of h11 + asyncio (bench/REPORT.md,
    "On a GPU (2026-11-26: one NVIDIA H200)", httptools + uvloop): it matters where the pass is cheap and the loop bounds requests/s."""
    http = "httptools" if find("httptools") else "h11"
    loop = "uvloop" if sys.platform != "win32" and find("uvloop") else "asyncio"
    note = f"http: {http}, event loop: {loop}"
    if (http, loop) != ("httptools", "uvloop"):
        note += " (pip install httptools uvloop: about 0.77x the event loop's CPU per request)"
    return http, loop, note


class Running:
    """A uvicorn server in a thread of this process (tests, benchmarks, notebooks): `url`, `stop()`."""

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, graceful_s: float = 30.0,
                 on_cut: Callable[[int], None] | None = None):
        import uvicorn

        http, loop, _ = http_stack()
        config = uvicorn.Config(create_app(engine, on_cut), host=host, port=port, log_level="warning", http=http, loop=loop,
                                timeout_graceful_shutdown=graceful_s, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="frozentune-serve", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {host}:{port}")
            time.sleep(0.01)
        sock = self.server.servers[0].sockets[0].getsockname()
        self.url = f"http://{host}:{sock[1]}"

    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, answer what is in flight, close the engine."""
        self.server.should_exit = True
        self.thread.join(timeout)


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) the way asyncio binds one for uvicorn (SO_REUSEADDR, proto
    TCP; IPv6 where the host has a ':'), listening, for `serve` to take before loading any model: a port in use
    or an address this machine lacks is then said at once, not after minutes of loading. ValueError
    says what to do. A host name binds the first address it resolves to (uvicorn's own bind listened
    on every address of "localhost", IPv4 and IPv6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections whose
    # socket says TCP, and accepted connections inherit it. With proto 0 every answer waited on the client's
    # delayed ACK: 0.81x the requests/s (8 heads, short texts; bench/REPORT.md)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        # listening at once: two SO_REUSEADDR sockets may both bind a port until one listens, so a bound-only
        # socket let another process take the port while the models loaded, and serve said it listened there.
        # Connections made while the models load wait in the backlog and are answered once they are up.
        sock.listen(2048)  # uvicorn's default backlog
    except OSError as e:
        sock.close()
        if isinstance(e, socket.gaierror):
            raise ServeError(f"--host {host}: not an address or a host name this machine can resolve "
                             f"({e.strerror}); give e.g. 127.0.0.1 (this machine only) or 0.0.0.0 "
                             f"(every interface)") from None
        if e.errno == errno.EADDRINUSE:
            raise ServeError(f"--port {port}: {host}:{port} is already in use (another server?); stop it or choose "
                             f"another --port") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise ServeError(f"--host {host}: no network interface of this machine has that address; give 127.0.0.1 "
                             f"(this machine only), 0.0.0.0 (every interface) or one of its own addresses") from None
        if e.errno == errno.EACCES:
            raise ServeError(f"--port {port}: not allowed to listen on it (ports below 1024 need privileges); choose "
                             f"a port from 1024 up") from None
        raise ServeError(f"cannot listen on {host}:{port} ({e.strerror or e}); choose another --host / --port") from None
    return sock


def stop_signals() -> tuple[int, ...]:
    """The signals on which `serve` stops gracefully: SIGINT and SIGTERM, as uvicorn's own, and SIGHUP (the
    terminal closed: it killed the server at once, dropping the requests in flight, with no exit line)
    unless it is ignored (nohup), which stays so."""
    out = [signal.SIGINT, signal.SIGTERM]
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        out.append(signal.SIGHUP)
    if hasattr(signal, "SIGBREAK"):  # Windows' Ctrl+Break, as uvicorn's
        out.append(signal.SIGBREAK)
    return tuple(out)


def _graceful_server(config, app=None, on_forced: Callable[[], None] | None = None):
    """A uvicorn Server that captures stop_signals() the way uvicorn captures SIGINT and SIGTERM: the
    first starts the graceful stop, and once the server is down each signal caught is raised again for
    the handlers before it (frozentune's: the exit line and status). A second SIGINT stops at once, as
    uvicorn's does (the requests in flight are not waited for: on_forced() is called); the app's lifespan
    is then still ended, without closing the engine (app.state.stop_now), since the interrupt would
    cancel it mid-wait and uvicorn print the cancelled lifespan's traceback."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            await super().shutdown(sockets)
            if self.force_exit and app is not None and self.config.lifespan != "off":
                await self.lifespan.shutdown()  # uvicorn skips it when forced; app.state.stop_now makes it quick

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
                yield
                return
            caught: list[int] = []

            def stop(sig: int, frame) -> None:
                caught.append(sig)
                forced = self.force_exit
                self.handle_exit(sig, frame)
                if self.force_exit and not forced:
                    if app is not None:
                        app.state.stop_now = True
                    if on_forced is not None:
                        on_forced()

            before = {sig: signal.signal(sig, stop) for sig in stop_signals()}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)
            for sig in reversed(caught):  # the last first, as uvicorn does
                signal.raise_signal(sig)

    return Server(config)


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, access_log: bool = False, log=print,
          sock: socket.socket | None = None, grace_s: float = 60.0,
          on_cut: Callable[[int], None] | None = None, on_forced: Callable[[], None] | None = None) -> None:
    """Run until SIGINT / SIGTERM / SIGHUP; then stop accepting, answer the requests in flight (for at most
    grace_s seconds: then each one still running is cut off with a 503 and counted in on_cut), and return;
    a second SIGINT stops at once (on_forced() is called).
    access_log: one line per request on stderr (off by default: under load it costs server CPU).
    sock: a socket already bound to host:port (listen_socket), else one is bound here."""
    import uvicorn

    sock = sock or listen_socket(host, port)
    port = sock.getsockname()[1]  # the one the system chose for --port 0
    http, loop, note = http_stack()
    if (said := raise_open_files()) is not None:
        log(f"serve: {said}")
    log(f"serve: {len(engine.tasks)} task{'' if len(engine.tasks) == 1 else 's'} on http://{host}:{port}  (page /, API /docs, metrics /metrics; {note})")
    app = create_app(engine, on_cut)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", access_log=access_log,
                            http=http, loop=loop, timeout_graceful_shutdown=grace_s,
                            use_colors=False if os.environ.get("NO_COLOR") else None)  # no-color.org; None: a terminal's
    with OpenFilesWatch(log):
        _graceful_server(config, app, on_forced).run(sockets=[sock])


# A server that may keep fewer open files than this is said so at start (each connection is one)
FEW_OPEN_FILES = 1024


def raise_open_files(limits=None) -> str | None:
    """Raise this process's soft limit on open files (ulimit -n) to its hard limit, as servers do: each
    connection holds one, and at the limit new connections were reset with nothing in the log. What was
    done, where it says anything: raised, or a limit that stays low; None where nothing needs saying.
    limits: (getrlimit, setrlimit), for tests."""
    import resource

    get, set_ = limits or (resource.getrlimit, resource.setrlimit)
    soft, hard = get(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < want and soft < FEW_OPEN_FILES:
        with contextlib.suppress(ValueError, OSError):
            set_(resource.RLIMIT_NOFILE, (want, hard))
            return f"open files: the limit (ulimit -n) raised from {soft} to {want}, this process's most"
    if soft < FEW_OPEN_FILES:
        n = open_files()
        now = f" and has {n} open" if n is not None else ""
        from ..cache import hard_limit

        return (f"open files: this process may have {soft} (ulimit -n; {hard_limit(hard)}){now}, and each "
                f"connection takes one: past about {soft - (n or 0)} connections at once new ones are dropped "
                f"unanswered; raise it before starting the server (ulimit -n 4096, or LimitNOFILE= in a systemd unit)")
    return None


def open_files() -> int | None:
    """How many files this process has open (Linux: /proc/self/fd, less the one reading it); None elsewhere or
    where it cannot be read."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError:
        return None


class OpenFilesWatch:
    """A thread that says, at most once a minute, when the process's open files come within 10% of its limit:
    past it the event loop cannot accept a connection, and uvloop drops it without a word (asyncio logs one
    line per accept). Linux (/proc/self/fd); elsewhere it does nothing."""

    def __init__(self, log: Callable[[str], None], every_s: float = 2.0, quiet_s: float = 60.0, limit=None):
        import resource

        self.log, self.every_s, self.quiet_s = log, every_s, quiet_s
        self.limit = limit if limit is not None else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frozentune-open-files", daemon=True)

    def __enter__(self) -> "OpenFilesWatch":
        if os.path.isdir("/proc/self/fd"):
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        # reading /proc/self/fd takes a file itself, which at the limit there is not: one is held in reserve
        # and let go just before each count (the count then includes neither it nor the reading)
        spare, said = _spare(), -float("inf")
        while not self._stop.wait(self.every_s):
            if spare is not None:
                os.close(spare)
            n, spare = open_files(), _spare()
            if n is not None:
                if n >= 0.9 * self.limit and time.monotonic() - said >= self.quiet_s:
                    said = time.monotonic()
                    self.log(f"serve: {n} open files of the {self.limit} this process may have (ulimit -n), one per "
                             f"connection: at the limit new connections are dropped unanswered; raise ulimit -n, or "
                             f"put a proxy that closes idle clients in front")
        if spare is not None:
            os.close(spare)


def _spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
