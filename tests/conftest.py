"""Shared fixtures: a fresh default graph per test, and a check that nothing leaks."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import asyncflow as af

pytest_plugins = ["pytester"]  # tests/test_pytest_plugin.py runs pytest on sample suites


@pytest.fixture(autouse=True)
def _fresh_default_graph() -> Iterator[None]:
    af.reset_default_graph()
    yield
    af.reset_default_graph()


@pytest.fixture
def graph() -> Iterator[af.Graph]:
    g = af.Graph()
    with g.as_default():
        yield g


@pytest.fixture
def no_leaked_threads() -> Iterator[None]:
    """Fails the test if it leaves asyncflow worker threads running."""
    yield
    alive = [t.name for t in threading.enumerate() if t.name.startswith("asyncflow-")]
    assert not alive, f"leaked worker threads: {alive}"
