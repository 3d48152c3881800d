"""The ``af.train`` namespace: checkpoints (TF 1.x ``tf.compat.v1.train``)."""

from __future__ import annotations

from asyncflow.train.saver import Saver, latest_checkpoint

__all__ = ["Saver", "latest_checkpoint"]
