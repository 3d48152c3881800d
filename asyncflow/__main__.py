"""``python -m asyncflow``: the ``asyncflow`` command (see :mod:`asyncflow.cli`)."""

from __future__ import annotations

from asyncflow.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
