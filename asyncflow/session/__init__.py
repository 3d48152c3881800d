"""The session layer: what ``af.Session`` is made of.

* :mod:`~asyncflow.session.core` — :class:`Session`: the plan cache, the doors of
  every entry point (``run``, ``run_sync``, callables, ``run_stream``, partial runs,
  ``eval`` / ``Operation.run``) and the one driver they all reach a step through;
* :mod:`~asyncflow.session.call` — a compiled signature bound to the session;
* :mod:`~asyncflow.session.fetch_feed` — fetch structures and feed conversion;
* :mod:`~asyncflow.session.callables`, :mod:`~asyncflow.session.partial_run`,
  :mod:`~asyncflow.session.streaming` — the entry points beyond ``run``;
* :mod:`~asyncflow.session.admission`, :mod:`~asyncflow.session.runners` —
  backpressure and the event loops behind ``run_sync``;
* :mod:`~asyncflow.session.seam` — the stated seams other modules use: the
  distributed master's :class:`~asyncflow.session.seam.SessionMaster` protocol and
  ``Session.internals``.
"""

from __future__ import annotations

from asyncflow.session.callables import SessionCallable
from asyncflow.session.core import Session, SessionStatistics

__all__ = ["Session", "SessionCallable", "SessionStatistics"]
