"""A caller whose step ``Session.close`` aborts: the step fails with the session's
``af.errors.CancelledError``, and the caller's own task is not cancelled by it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import asyncflow as af


async def closed_run(sess: af.Session, fetches: Any, feed: Mapping[Any, Any]) -> list[Any]:
    """``await sess.run(fetches, feed)`` in a caller that ``close`` is expected to abort:
    what it saw, the step's ``af.errors.CancelledError`` and then ``"went on"`` once it
    awaited again with no cancellation of its own (the step's abort is never the
    caller's: its task's cancel requests stay at zero)."""
    outcome: list[Any] = []
    try:
        await sess.run(fetches, feed)
    except af.errors.CancelledError as exc:
        outcome.append(exc)
    me = asyncio.current_task()
    assert me is not None
    assert me.cancelling() == 0
    await asyncio.sleep(0)  # a cancellation left pending would be raised here
    outcome.append("went on")
    return outcome


def assert_closed(outcome: list[Any]) -> None:
    """The step failed because the session closed, and the caller went on."""
    assert isinstance(outcome[0], af.errors.CancelledError), outcome
    assert "closed" in str(outcome[0])
    assert outcome[1:] == ["went on"]
