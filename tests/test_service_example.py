"""examples/service: the Starlette scoring app driven through its real ASGI stack.

Requests go through httpx's ASGI transport into Starlette (routing, lifespan, JSON)
and the app's graph calls the second service (another Starlette app) over httpx.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

SERVICE_DIR = Path(__file__).resolve().parent.parent / "examples" / "service"
SLOW_USER = 999


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    monkeypatch.syspath_prepend(str(SERVICE_DIR))
    try:
        yield importlib.import_module("app"), importlib.import_module("risk_service")
    finally:
        sys.modules.pop("app", None)
        sys.modules.pop("risk_service", None)


class Service:
    def __init__(self, client: Any, risk_stats: Any, app: Any, mod: ModuleType) -> None:
        self.client, self.risk_stats, self.app, self.mod = client, risk_stats, app, mod


@pytest.fixture
async def service(modules: tuple[ModuleType, ModuleType]) -> AsyncIterator[Service]:
    app_mod, risk_mod = modules
    risk_app = risk_mod.create_risk_app(slow_users={SLOW_USER})
    app = app_mod.create_app(httpx.ASGITransport(app=risk_app))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://scoring.test"
        ) as client,
    ):
        yield Service(client, risk_app.state.stats, app, app_mod)


async def test_200_concurrent_requests(
    service: Service, modules: tuple[ModuleType, ModuleType]
) -> None:
    risk_of = modules[1].risk_of
    bodies = [{"user_id": uid, "amounts": [float(uid % 5), 2.5]} for uid in range(1, 201)]
    responses = await asyncio.gather(*(service.client.post("/score", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * 200
    for body, response in zip(bodies, responses, strict=True):
        uid = body["user_id"]
        expected = service.mod.expected_score(uid, body["amounts"], risk_of(uid))
        assert response.json() == {"user_id": uid, "score": pytest.approx(expected, rel=1e-6)}
    stats = service.risk_stats
    assert (stats.started, stats.finished, stats.cancelled) == (200, 200, 0)
    assert stats.max_concurrent > 1  # the steps overlapped on the one session


async def test_deadline_is_504_and_stops_the_call(service: Service) -> None:
    slow, fast = await asyncio.gather(
        service.client.post(
            "/score", json={"user_id": SLOW_USER, "amounts": [1.0], "timeout_ms": 50}
        ),
        service.client.post("/score", json={"user_id": 3, "amounts": [1.0]}),
    )
    assert slow.status_code == 504
    assert slow.json()["error"] == "deadline exceeded"
    assert fast.status_code == 200
    stats = service.risk_stats
    assert (stats.started, stats.finished, stats.cancelled) == (2, 1, 1)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"user_id": 5, "amounts": [-1.0, 2.0]}, 400, "amounts must not be negative"),
        ({"user_id": 5, "amounts": [[1.0, 2.0]]}, 400, "Cannot feed value of shape (1, 2)"),
        ({"user_id": 5, "amounts": ["x"]}, 400, "amounts"),
        ({"amounts": [1.0]}, 400, "'user_id' must be an integer"),
        ({"user_id": 5, "timeout_ms": -3}, 400, "'timeout_ms' must be a positive integer"),
        ([1, 2], 400, "must be a JSON object"),
        ({"user_id": 5000, "amounts": []}, 404, "no user 5000"),
    ],
)
async def test_bad_requests(service: Service, body: Any, status: int, fragment: str) -> None:
    response = await service.client.post("/score", json=body)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]
    ok = await service.client.post("/score", json={"user_id": 5, "amounts": [1.0]})
    assert ok.status_code == 200  # the session stays usable


async def test_invalid_argument_is_logged_with_its_node_and_sent_without(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="scoring"):
        response = await service.client.post("/score", json={"user_id": 5, "amounts": [-1.0]})
    assert response.status_code == 400
    body = response.json()
    assert set(body) == {"error", "status", "error_id"}
    assert body["status"] == 400
    assert body["error"] == "ValueError: amounts must not be negative, got [-1.0]"
    assert "check_amounts" not in response.text
    assert str(SERVICE_DIR) not in response.text
    (record,) = [r for r in caplog.records if body["error_id"] in r.getMessage()]
    assert "check_amounts" in record.getMessage()  # the node, for whoever reads the log
    assert str(SERVICE_DIR / "app.py") in record.getMessage()


async def test_server_errors_send_no_details(
    modules: tuple[ModuleType, ModuleType], caplog: pytest.LogCaptureFixture
) -> None:
    app_mod, _ = modules

    def refuse(request: Any) -> Any:
        raise httpx.ConnectError("connection refused by 10.1.2.3", request=request)

    app = app_mod.create_app(httpx.MockTransport(refuse))
    with caplog.at_level(logging.INFO, logger="scoring"):
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://scoring.test"
            ) as client,
        ):
            response = await client.post("/score", json={"user_id": 5, "amounts": [1.0]})
    assert response.status_code == 503
    body = response.json()
    assert body == {
        "error": "a backend service is unavailable",
        "status": 503,
        "error_id": body["error_id"],
    }
    assert re.fullmatch(r"[0-9a-f]{12}", body["error_id"])
    (record,) = [r for r in caplog.records if body["error_id"] in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "10.1.2.3" in record.getMessage()
    assert record.exc_info is not None  # the traceback stays on the server


async def test_malformed_json_is_400(service: Service) -> None:
    response = await service.client.post(
        "/score", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"].startswith("bad request")


async def test_client_cancelling_its_request_cancels_the_step(service: Service) -> None:
    request = asyncio.create_task(
        service.client.post(
            "/score", json={"user_id": SLOW_USER, "amounts": [1.0], "timeout_ms": 60_000}
        )
    )
    await service.risk_stats.in_flight.wait()
    request.cancel()
    await asyncio.wait([request])
    assert request.cancelled()
    assert service.risk_stats.cancelled == 1
    ok = await service.client.post("/score", json={"user_id": 2, "amounts": []})
    assert ok.status_code == 200


async def test_disconnect_message_cancels_the_step(service: Service) -> None:
    """A server (uvicorn) reports a client that went away as ``http.disconnect``."""
    body = json.dumps({"user_id": SLOW_USER, "amounts": [1.0], "timeout_ms": 60_000}).encode()
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/score",
        "raw_path": b"/score",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("scoring.test", 80),
        "state": {},
    }
    handler = asyncio.create_task(service.app(scope, receive, send))
    await service.risk_stats.in_flight.wait()
    gone.set()
    await handler
    assert service.risk_stats.cancelled == 1
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == service.mod.CLIENT_CLOSED_REQUEST


async def test_risk_service_down_is_503(modules: tuple[ModuleType, ModuleType]) -> None:
    app_mod, _ = modules

    def refuse(request: Any) -> Any:
        raise httpx.ConnectError("connection refused", request=request)

    app = app_mod.create_app(httpx.MockTransport(refuse))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://scoring.test"
        ) as client,
    ):
        response = await client.post("/score", json={"user_id": 5, "amounts": [1.0]})
    assert response.status_code == 503
    assert response.json()["error"] == "a backend service is unavailable"


def test_demo_runs() -> None:
    env = {**os.environ, "PYTHONWARNINGS": "error", "PYTHONPATH": str(SERVICE_DIR.parent.parent)}
    proc = subprocess.run(
        [sys.executable, str(SERVICE_DIR / "app.py")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("104 concurrent requests in ")
    assert lines[0].endswith("statuses {200: 100, 400: 2, 404: 1, 504: 1}")
    assert lines[2] == "slow user 999 with a 50 ms deadline -> 504 deadline exceeded"


def test_the_readmes_install_brings_what_it_runs() -> None:
    """examples/service/README.md installs the `service` extra, then runs uvicorn."""
    readme = (SERVICE_DIR / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[service]"' in readme
    assert "uvicorn app:app" in readme
    pyproject = tomllib.loads(
        (SERVICE_DIR.parent.parent / "pyproject.toml").read_text(encoding="utf-8")
    )
    service = pyproject["project"]["optional-dependencies"]["service"]
    assert {re.split(r"[<>=\[ ]", r)[0] for r in service} >= {"starlette", "httpx", "uvicorn"}
