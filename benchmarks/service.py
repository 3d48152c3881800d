"""The service workload: an ASGI app under load, ``await sess.run`` vs ``asyncio.gather``.

A Starlette app with two endpoints doing the same work per request: two awaited
"I/O" coroutines (``asyncio.sleep(service_sleep)``, a database call's stand-in) on
the request's value and on value + 1, then a few numpy ops on their results:

- ``/run``: ``await sess.run(y, feed_dict={x: v})`` of a graph whose two async
  ``py_func`` kernels are those coroutines (``y = (io(x) + io(x + 1)) * 2``);
- ``/gather``: ``asyncio.gather`` of the same two coroutines, then the same ops.

The app is served by uvicorn (asyncio loop; httptools when installed) in a child
process on a local port (``python -m benchmarks.service serve FD SLEEP``: the parent
binds the socket and hands it over, so there is no port race), and loaded from
the benchmark process with an ``aiohttp.ClientSession`` keeping ``concurrency``
requests in flight over as many keep-alive connections (aiohttp's client costs
~0.1 ms of CPU per request here; httpx's AsyncClient took ~5 ms with 50 connections,
which made the load generator, not the server, the bottleneck).  Each repeat sends
``requests`` requests to one endpoint; the endpoints alternate repeat by repeat
(and which goes first alternates too).  Per repeat: p50 / p99 latency (measured at
the client, request sent to response read) and the server process's CPU time per
request (its ``time.process_time()`` before and after, read from ``/stats``).

Starlette, uvicorn (with httptools) and aiohttp are the ``bench`` extra (``pip install -e ".[bench]"``):
benchmark-only, never dependencies of asyncflow.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import benchmarks  # noqa: F401  (pins BLAS threads before numpy is imported)
from benchmarks.process import REPO_ROOT, child_env

if TYPE_CHECKING:
    from starlette.requests import Request

#: What the bench extra brings; the workload is skipped when one is missing.
BENCH_MODULES = ("starlette", "uvicorn", "aiohttp")
ENDPOINTS = ("run", "gather")
EXPECTED = "6.0"  # (1 + 2) * 2 for x = 1


def missing_modules() -> list[str]:
    """The bench extra's modules that cannot be imported here."""
    missing = []
    for module in BENCH_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


# --------------------------------------------------------------------------- server side


def create_app(sleep: float) -> Any:
    """The Starlette app: ``/run``, ``/gather`` and ``/stats`` (server CPU, GC counts)."""
    import numpy as np
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    import asyncflow as af

    async def io(v: Any) -> Any:
        """The request's awaited I/O: a database or service call's stand-in."""
        await asyncio.sleep(sleep)
        return v

    one, two = np.float32(1.0), np.float32(2.0)
    g = af.Graph()
    with g.as_default():
        x = af.placeholder(af.float32, shape=(), name="x")
        a = af.py_func(io, [x], af.float32, name="io_a")
        b = af.py_func(io, [af.add(x, one)], af.float32, name="io_b")
        y = af.multiply(af.add(a, b), two, name="y")
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with af.Session(graph=g) as sess:
            state["sess"] = sess
            yield

    async def run_endpoint(request: Request) -> PlainTextResponse:
        v = float(request.query_params["x"])
        value = await state["sess"].run(y, feed_dict={x: v})
        return PlainTextResponse(str(float(value)))

    async def gather_endpoint(request: Request) -> PlainTextResponse:
        v = np.float32(float(request.query_params["x"]))
        ra, rb = await asyncio.gather(io(v), io(np.add(v, one)))
        value = np.multiply(np.add(ra, rb), two)
        return PlainTextResponse(str(float(value)))

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(
            {"cpu": time.process_time(), "gc": [s["collections"] for s in gc.get_stats()]}
        )

    return Starlette(
        routes=[
            Route("/run", run_endpoint),
            Route("/gather", gather_endpoint),
            Route("/stats", stats),
        ],
        lifespan=lifespan,
    )


def http_impl() -> str:
    """uvicorn's HTTP protocol: httptools (C parser) when installed, else h11."""
    return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"


def serve(fd: int, sleep: float) -> None:
    """Serve the app on the listening socket ``fd`` (inherited from the parent).

    The socket is handed to uvicorn as a socket object whose family, type and protocol
    are read from ``fd`` itself (TCP), as when uvicorn binds a host and port: asyncio
    then sets ``TCP_NODELAY`` on each accepted connection.  (``uvicorn.run(fd=...)``
    wraps the descriptor as an ``AF_UNIX`` socket, so asyncio leaves Nagle's algorithm
    on; the response's body, written after its headers, then waits for the client's
    delayed ACK: ~40 ms per request, the server idle meanwhile.)
    """
    import uvicorn

    config = uvicorn.Config(
        create_app(sleep),
        loop="asyncio",
        http=http_impl(),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])


# --------------------------------------------------------------------------- load side


@dataclass
class Repeat:
    """One repeat against one endpoint."""

    endpoint: str
    latencies: list[float]  # seconds, one per request
    wall: float  # seconds for all the requests
    server_cpu: float  # server process CPU seconds for them
    client_cpu: float  # the load generator's (this process's) CPU seconds for them
    gc_collections: list[int] = field(default_factory=list)  # per generation

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _load(client: Any, endpoint: str, requests: int, concurrency: int) -> list[float]:
    """``requests`` GETs of ``endpoint``, ``concurrency`` in flight; their latencies."""
    latencies: list[float] = []
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            start = time.perf_counter()
            async with client.get(f"/{endpoint}?x=1") as resp:
                text = await resp.text()
            latencies.append(time.perf_counter() - start)
            if resp.status != 200 or text != EXPECTED:
                raise AssertionError(
                    f"/{endpoint} answered {resp.status} {text[:200]!r}, expected 200 {EXPECTED!r}"
                )

    async with asyncio.TaskGroup() as tg:
        for _ in range(concurrency):
            tg.create_task(worker())
    return latencies


async def _stats(client: Any) -> dict[str, Any]:
    async with client.get("/stats") as resp:
        resp.raise_for_status()
        data: dict[str, Any] = await resp.json()
    return data


async def _drive(
    port: int, requests: int, concurrency: int, repeats: int, child: subprocess.Popen[bytes]
) -> list[Repeat]:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        f"http://127.0.0.1:{port}", connector=connector, timeout=aiohttp.ClientTimeout(total=30.0)
    ) as client:
        deadline = time.monotonic() + 60.0
        while True:  # wait for the server (its lifespan opens the session)
            try:
                await _stats(client)
                break
            except aiohttp.ClientConnectionError as exc:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the service did not start (exit {child.poll()})") from exc
                await asyncio.sleep(0.05)
        for endpoint in ENDPOINTS:  # warm-up: connections, the plan's compilation
            await _load(client, endpoint, max(concurrency, requests // 10), concurrency)
        out = []
        for r in range(repeats):
            for endpoint in ENDPOINTS if r % 2 == 0 else ENDPOINTS[::-1]:
                before = await _stats(client)
                start, cpu = time.perf_counter(), time.process_time()
                latencies = await _load(client, endpoint, requests, concurrency)
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                after = await _stats(client)
                out.append(
                    Repeat(
                        endpoint,
                        latencies,
                        wall,
                        after["cpu"] - before["cpu"],
                        cpu,
                        [a - b for a, b in zip(after["gc"], before["gc"])],
                    )
                )
        return out


def measure(requests: int, concurrency: int, sleep: float, repeats: int) -> list[Repeat]:
    """Start the server in a child process, load it, stop it: every repeat."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(max(128, concurrency * 2))
    port = sock.getsockname()[1]
    # The server's stderr goes to a file: a pipe nobody reads while the load runs
    # could fill up and block the server.
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.service", "serve", str(sock.fileno()), str(sleep)],
            pass_fds=[sock.fileno()],
            env=child_env(),
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        sock.close()  # the child has its own copy
        try:
            return asyncio.run(_drive(port, requests, concurrency, repeats, child))
        except Exception as exc:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{exc}; server stderr: {' | '.join(tail)}") from exc
        finally:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


# --------------------------------------------------------------------------- census


def census(requests: int) -> dict[str, dict[str, float]]:
    """Bytecodes per request of each endpoint, counted in this process (``sys.settrace``
    with opcode events): the app is driven through its ASGI interface, no HTTP, one
    request at a time, with ``asyncio.sleep(0)`` as its I/O stand-in, so the counts are
    the same from run to run (a figure the machine's noise does not move).  Per
    endpoint: every bytecode the request runs (the app, Starlette, asyncio), and
    asyncflow's own among them."""
    return asyncio.run(_census(requests))


async def _census(requests: int) -> dict[str, dict[str, float]]:
    import asyncflow
    from asyncflow.runtime.block_code import FILENAME

    root = os.path.dirname(asyncflow.__file__) + os.sep
    app = create_app(0.0)
    async with _lifespan(app):
        return {
            endpoint: await _count(app, endpoint, requests, root, FILENAME)
            for endpoint in ENDPOINTS
        }


async def _count(
    app: Any, endpoint: str, requests: int, root: str, blocks_file: str
) -> dict[str, float]:
    """The bytecodes per request of ``endpoint``: all, and asyncflow's (those of files
    under ``root``, and of programs' blocks, whose file is ``blocks_file``)."""
    for _ in range(max(10, requests // 10)):  # warm-up: the plan's compilation
        await _asgi_get(app, endpoint)
    counts = {"all": 0, "asyncflow": 0}

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts["all"] += 1
            filename = frame.f_code.co_filename
            if filename.startswith(root) or filename == blocks_file:  # (a program's code too)
                counts["asyncflow"] += 1
        return tracer

    sys.settrace(tracer)
    try:
        for _ in range(requests):
            await _asgi_get(app, endpoint)
    finally:
        sys.settrace(None)
    return {k: v / requests for k, v in counts.items()}


@contextlib.asynccontextmanager
async def _lifespan(app: Any) -> AsyncIterator[None]:
    """The app's ASGI lifespan (its session open) around the block."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))
    try:
        await inbox.put({"type": "lifespan.startup"})
        started = await asyncio.wait_for(outbox.get(), 30.0)
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {started}")
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 30.0)


async def _asgi_get(app: Any, endpoint: str) -> None:
    """One ``GET /endpoint?x=1`` through the app's ASGI interface; checks the answer."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/{endpoint}",
        "raw_path": f"/{endpoint}".encode(),
        "query_string": b"x=1",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0].get("status")
    body = b"".join(m.get("body", b"") for m in sent[1:])
    if status != 200 or body != EXPECTED.encode():
        raise AssertionError(
            f"/{endpoint} answered {status} {body[:200]!r}, expected 200 {EXPECTED!r}"
        )


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        serve(int(argv[1]), float(argv[2]))
        return 0
    # python -m benchmarks.service [REQUESTS CONCURRENCY SLEEP REPEATS]: one JSON line
    requests, concurrency, sleep, repeats = (
        (int(argv[0]), int(argv[1]), float(argv[2]), int(argv[3])) if argv else (2000, 50, 0.001, 3)
    )
    reps = measure(requests, concurrency, sleep, repeats)
    print(
        json.dumps(
            [
                {
                    "endpoint": r.endpoint,
                    "p50": r.percentile(0.5),
                    "p99": r.percentile(0.99),
                    "wall": r.wall,
                    "cpu_per_request": r.server_cpu / len(r.latencies),
                    "client_cpu_per_request": r.client_cpu / len(r.latencies),
                    "gc": r.gc_collections,
                }
                for r in reps
            ]
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
