"""The ``af.train`` namespace: checkpoints and recovery (TF 1.x ``tf.compat.v1.train``)."""

from __future__ import annotations

from asyncflow.train.monitored_session import MonitoredSession
from asyncflow.train.saver import Saver, latest_checkpoint

__all__ = ["MonitoredSession", "Saver", "latest_checkpoint"]
