"""asyncflow runs on asyncio: a clear error when awaited from another event loop (trio).

Steps are ``asyncio.TaskGroup``s, deadlines ``asyncio.timeout`` and rendezvous
``asyncio.Future``s, so an ``await`` of asyncflow from trio (directly or through
anyio's trio backend) cannot work.  :func:`require_asyncio` turns the obscure
failure it would cause deep inside a step into one ``RuntimeError`` at the entry
point that says what to do instead (anyio users: ``anyio.run(..., backend="asyncio")``).
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["require_asyncio", "running_loop"]

#: This thread's running event loop, or None (asks once, raises nothing): the check a
#: per-step path makes before :func:`require_asyncio`, without a Python call.
running_loop = asyncio._get_running_loop


def require_asyncio(what: str = "asyncflow") -> asyncio.AbstractEventLoop:
    """The asyncio event loop running this thread; else ``RuntimeError`` saying why.

    Called at the start of asyncflow's coroutines (``Session.run`` and friends),
    before any asyncio object is made.  Costs one ``get_running_loop`` call (a system
    call in CPython: a caller that needs the loop takes it from here).
    """
    loop = running_loop()
    if loop is not None:
        return loop
    library = _current_async_library()
    if library is None:
        raise RuntimeError(
            f"{what} must be awaited inside an asyncio event loop "
            f"(asyncio.run(...)); from plain code use sess.run_sync(...)"
        )
    raise RuntimeError(
        f"{what} needs the asyncio event loop, but it was awaited from "
        f"{library}; run your program with asyncio (anyio users: "
        f"anyio.run(main, backend='asyncio'))"
    )


def _current_async_library() -> str | None:
    """The name of the async library running this thread's event loop, if any but asyncio."""
    # Only look when trio was imported: asyncflow does not depend on it or on sniffio.
    trio = sys.modules.get("trio")
    if trio is not None and trio.lowlevel.in_trio_run():
        return "trio"
    return None
