"""The ``af.nn`` namespace: neural-network ops (TensorFlow's ``tf.nn``)."""

from __future__ import annotations

from asyncflow.ops.nn_ops import relu, sigmoid, softmax

__all__ = ["relu", "sigmoid", "softmax"]
