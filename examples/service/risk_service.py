"""The second local service the scoring graph calls: ``GET /risk/{user_id}`` → ``{"risk": r}``.

A small Starlette app standing in for a real dependency (a feature store, a fraud
model behind HTTP).  Every call awaits ``latency_s``; users in ``slow_users`` take
``slow_latency_s`` (to show deadlines).  ``stats`` counts calls started, finished
and cancelled, so a test can see that a caller's deadline or disconnect stopped
the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from starlette.requests import Request


@dataclass
class RiskStats:
    """What the risk service saw."""

    started: int = 0
    finished: int = 0
    cancelled: int = 0
    max_concurrent: int = 0
    in_flight: asyncio.Event = field(default_factory=asyncio.Event)


def risk_of(user_id: int) -> float:
    """The (made-up) risk score of a user, in [0, 1)."""
    return (user_id * 37 % 100) / 100.0


def create_risk_app(
    latency_s: float = 0.005, slow_users: Collection[int] = (), slow_latency_s: float = 5.0
) -> Starlette:
    """The risk service; its :class:`RiskStats` is ``app.state.stats``."""
    stats = RiskStats()

    async def risk(request: Request) -> JSONResponse:
        user_id = int(request.path_params["user_id"])
        stats.started += 1
        stats.max_concurrent = max(
            stats.max_concurrent, stats.started - stats.finished - stats.cancelled
        )
        stats.in_flight.set()
        try:
            await asyncio.sleep(slow_latency_s if user_id in slow_users else latency_s)
        except asyncio.CancelledError:
            stats.cancelled += 1
            raise
        stats.finished += 1
        return JSONResponse({"user_id": user_id, "risk": risk_of(user_id)})

    app = Starlette(routes=[Route("/risk/{user_id:int}", risk)])
    app.state.stats = stats
    return app
