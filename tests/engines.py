"""Which engine a step runs on, for tests that record it (a step *is* its engine:
``Step(...)`` makes a step of the straight-line interpreter's class or of the general
propagator's)."""

from __future__ import annotations

from typing import Any

from asyncflow.runtime.interpreter import ProgramPropagator
from asyncflow.runtime.propagators import PropagatorState


def engine_name(step: Any) -> str:
    """``"ProgramPropagator"`` or ``"PropagatorState"``: the engine ``step`` runs on."""
    if isinstance(step, ProgramPropagator):
        return "ProgramPropagator"
    assert isinstance(step, PropagatorState), type(step)
    return "PropagatorState"
