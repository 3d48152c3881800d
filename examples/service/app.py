"""A scoring service on asyncflow: one session for the app, one step per request.

``POST /score`` with ``{"user_id": 7, "amounts": [12.5, 3.0], "timeout_ms": 500}``
runs one step of a graph that mixes

* async I/O kernels: an HTTP call to the risk service (a second local service,
  ``risk_service.py``) and a simulated database lookup, which overlap in the step;
* a sync Python check (negative amounts → ``ValueError``);
* numpy kernels that combine the features into a score.

The app creates its session (and HTTP client) in its lifespan and maps asyncflow
errors to HTTP statuses at the boundary: deadline → 504, invalid argument (bad
body, bad feed, a kernel's ``ValueError``) → 400, unknown user → 404, the risk
service unreachable → 503, anything else → 500.  An error body is the status, a short
message and an error id (``{"error": ..., "status": 504, "error_id": ...}``); the
error itself, with its node and the server's file paths, goes to the log (logger
``scoring``) under that id, never to the client.  When the client disconnects, the
request's step is cancelled (status 499 is logged, nothing is sent).

Run the self-driving demo with ``python examples/service/app.py`` (needs
``pip install -e ".[service]"``, which brings uvicorn too); or serve it, e.g. with
``uvicorn app:app`` from this directory, with the risk service at ``RISK_URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx
import numpy as np
from risk_service import create_risk_app
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import asyncflow as af

if TYPE_CHECKING:
    from starlette.requests import Request

logger = logging.getLogger("scoring")

DB_LATENCY_S = 0.002
#: Weights of (total spend, mean past spend, risk) and the bias of the score.
WEIGHTS = np.array([0.01, -0.02, 3.0], np.float32)
BIAS = np.float32(-1.0)
CLIENT_CLOSED_REQUEST = 499  # the nginx convention: the client went away first

#: The simulated database: each user's past purchase amounts.
USERS: dict[int, list[float]] = {
    uid: [float(uid % 7), float(uid % 11), 5.0] for uid in range(1, 1001)
}


def expected_score(user_id: int, amounts: list[float], risk: float) -> float:
    """The score the graph computes, in plain numpy (the tests' oracle)."""
    features = np.array([sum(amounts), np.mean(USERS[user_id]), risk], np.float32)
    return float(1.0 / (1.0 + np.exp(-(features @ WEIGHTS + BIAS))))


class Backends:
    """The I/O kernels' dependencies: the risk service's HTTP client and the database."""

    def __init__(self, risk_client: httpx.AsyncClient, db: Mapping[int, list[float]]) -> None:
        self._risk = risk_client
        self._db = db

    async def risk(self, user_id: np.ndarray) -> np.ndarray:
        """Ask the risk service (an async kernel: awaited on the event loop)."""
        try:
            response = await self._risk.get(f"/risk/{int(user_id)}")
        except httpx.TransportError as exc:
            raise af.errors.UnavailableError(None, None, f"risk service: {exc!r}") from exc
        response.raise_for_status()
        return np.asarray(response.json()["risk"], np.float32)

    async def history(self, user_id: np.ndarray) -> np.ndarray:
        """The user's past amounts from the (simulated) database."""
        await asyncio.sleep(DB_LATENCY_S)
        try:
            return np.asarray(self._db[int(user_id)], np.float32)
        except KeyError:
            raise af.errors.NotFoundError(None, None, f"no user {int(user_id)}") from None


def check_amounts(amounts: np.ndarray) -> np.ndarray:
    """Reject negative amounts (a ValueError fails the step with InvalidArgumentError)."""
    if (amounts < 0).any():
        raise ValueError(f"amounts must not be negative, got {amounts.tolist()}")
    return amounts


@dataclass(frozen=True)
class ScoringGraph:
    """The graph and the tensors a request feeds and fetches."""

    graph: af.Graph
    user_id: af.Tensor
    amounts: af.Tensor
    score: af.Tensor


def build_graph(backends: Backends) -> ScoringGraph:
    graph = af.Graph()
    with graph.as_default():
        user_id = af.placeholder(af.int64, shape=(), name="user_id")
        amounts = af.placeholder(af.float32, shape=(None,), name="amounts")
        risk = af.py_func(backends.risk, [user_id], af.float32, name="risk")
        risk.set_shape(())
        history = af.py_func(backends.history, [user_id], af.float32, name="history")
        history.set_shape((None,))
        checked = af.py_func(check_amounts, [amounts], af.float32, name="check_amounts")
        features = af.stack(
            [af.reduce_sum(checked), af.reduce_mean(history), risk], name="features"
        )
        logit = af.reduce_sum(features * af.constant(WEIGHTS)) + BIAS
        score = af.nn.sigmoid(logit, name="score")
    graph.finalize()
    return ScoringGraph(graph, user_id, amounts, score)


class BadRequest(ValueError):
    """The request body does not describe a scoring request."""


def parse_body(body: Any) -> tuple[int, Any, int]:
    """(user_id, amounts, timeout_ms) of a request body; ``BadRequest`` saying what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    fields = cast("dict[str, Any]", body)
    user_id, amounts = fields.get("user_id"), fields.get("amounts", [])
    timeout_ms = fields.get("timeout_ms", 1000)
    if not isinstance(user_id, int) or isinstance(user_id, bool):
        raise BadRequest("'user_id' must be an integer")
    if not isinstance(timeout_ms, int) or timeout_ms <= 0:
        raise BadRequest("'timeout_ms' must be a positive integer")
    return user_id, amounts, timeout_ms


#: What a client is told for a server-side failure (its details stay in the log).
PUBLIC_REASONS = {
    500: "internal error",
    503: "a backend service is unavailable",
    504: "deadline exceeded",
}
_NODE_TRACE = re.compile(r"\s*\[\[.*$", re.S)  # asyncflow's "[[node ... defined at ...]]"


def error_response(exc: Exception, status: int) -> JSONResponse:
    """The client's view of a failed request: the status, a short message and an id
    to quote; the error itself (node, op, the server's file paths) is logged under
    that id, never sent."""
    error_id = uuid.uuid4().hex[:12]
    level = logging.WARNING if status >= 500 else logging.INFO
    logger.log(
        level,
        "request failed [%s] status %d: %s: %s",
        error_id,
        status,
        type(exc).__name__,
        exc,
        exc_info=exc if status >= 500 else None,
    )
    return JSONResponse(
        {"error": public_message(exc, status), "status": status, "error_id": error_id},
        status_code=status,
    )


def public_message(exc: Exception, status: int) -> str:
    """A short message for the client: a fixed reason for server-side failures; for
    the client's own mistakes (4xx) what was wrong, without the node trace."""
    if status >= 500:
        return PUBLIC_REASONS.get(status, "internal error")
    text = exc.message if isinstance(exc, af.errors.OpError) else str(exc)
    text = _NODE_TRACE.sub("", text).strip().splitlines()[0] if text.strip() else ""
    return text[:200] or type(exc).__name__


def status_for(exc: Exception) -> int:
    """The HTTP status of an error raised while serving a request."""
    if isinstance(exc, af.errors.DeadlineExceededError):
        return 504
    if isinstance(exc, af.errors.InvalidArgumentError | ValueError | TypeError):
        return 400  # also a feed that does not fit its placeholder (ValueError/TypeError)
    if isinstance(exc, af.errors.NotFoundError):
        return 404
    if isinstance(exc, af.errors.UnavailableError):
        return 503
    return 500


async def _cancel_on_disconnect(request: Request, step: asyncio.Task[Any]) -> None:
    """Cancel ``step`` when the client disconnects (after the body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            step.cancel()
            return


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> tuple[bool, Any]:
    """``(True, result or exception)``, or ``(False, None)`` if the client left first."""

    async def attempt() -> Any:
        try:
            return await work
        except Exception as exc:  # returned, so the task group does not wrap it
            return exc

    async with asyncio.TaskGroup() as tg:
        step = tg.create_task(attempt())
        watcher = tg.create_task(_cancel_on_disconnect(request, step))
        step.add_done_callback(lambda _: watcher.cancel())
    if step.cancelled():
        return False, None
    return True, step.result()


async def score(request: Request) -> Response:
    state: ScoringGraph = request.app.state.scoring
    sess: af.Session = request.app.state.session
    try:
        user_id, amounts, timeout_ms = parse_body(await request.json())
    except ValueError as exc:  # also JSONDecodeError
        return error_response(BadRequest(f"bad request: {exc}"), 400)
    options = af.RunOptions(timeout_in_ms=timeout_ms)
    run = sess.run(state.score, {state.user_id: user_id, state.amounts: amounts}, options=options)
    finished, outcome = await _unless_disconnected(request, run)
    if not finished:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if isinstance(outcome, Exception):
        return error_response(outcome, status_for(outcome))
    return JSONResponse({"user_id": user_id, "score": float(outcome)})


def create_app(
    risk_transport: httpx.AsyncBaseTransport | None = None, risk_url: str = "http://risk.local"
) -> Starlette:
    """The scoring app; its lifespan opens the risk client and the session, then closes both."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncGenerator[None, None]:
        async with httpx.AsyncClient(transport=risk_transport, base_url=risk_url) as client:
            scoring = build_graph(Backends(client, USERS))
            async with af.Session(graph=scoring.graph) as sess:
                app.state.scoring, app.state.session = scoring, sess
                yield

    return Starlette(routes=[Route("/score", score, methods=["POST"])], lifespan=lifespan)


def _app_from_environment() -> Starlette:
    """For ``uvicorn app:app``: the risk service at ``RISK_URL``, or in-process."""
    url = os.environ.get("RISK_URL")
    if url:
        return create_app(risk_url=url)
    return create_app(httpx.ASGITransport(app=create_risk_app()))


app = _app_from_environment()


async def demo() -> None:
    service = create_app(httpx.ASGITransport(app=create_risk_app(slow_users={999})))
    transport = httpx.ASGITransport(app=service)
    async with (
        service.router.lifespan_context(service),
        httpx.AsyncClient(transport=transport, base_url="http://scoring.local") as client,
    ):
        start = time.perf_counter()
        bodies: list[dict[str, Any]] = [
            {"user_id": uid, "amounts": [10.0, 2.5]} for uid in range(1, 101)
        ]
        bodies += [
            {"user_id": 999, "amounts": [1.0], "timeout_ms": 50},
            {"user_id": 5, "amounts": [-1.0]},
            {"user_id": 5000},
            {"amounts": []},
        ]
        responses = await asyncio.gather(*(client.post("/score", json=b) for b in bodies))
        elapsed = time.perf_counter() - start
    statuses: dict[int, int] = {}
    for r in responses:
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    print(
        f"{len(bodies)} concurrent requests in {elapsed * 1000:.0f} ms; "
        f"statuses {dict(sorted(statuses.items()))}"
    )
    print("user 1 ->", responses[0].json())
    print(
        "slow user 999 with a 50 ms deadline ->",
        responses[100].status_code,
        responses[100].json()["error"],
    )


if __name__ == "__main__":
    asyncio.run(demo())
