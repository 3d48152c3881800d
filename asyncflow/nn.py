"""The ``af.nn`` namespace: neural-network ops (TensorFlow's ``tf.nn``)."""

from __future__ import annotations

from asyncflow.ops.conv_ops import avg_pool, conv2d, conv2d_transpose, depthwise_conv2d, max_pool
from asyncflow.ops.extra_math_ops import softplus, softsign, top_k
from asyncflow.ops.nn_ops import (
    bias_add,
    elu,
    fused_batch_norm,
    l2_normalize,
    leaky_relu,
    log_softmax,
    relu,
    relu6,
    selu,
    sigmoid,
    softmax,
    softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy_with_logits,
)

__all__ = [
    "avg_pool",
    "bias_add",
    "conv2d",
    "conv2d_transpose",
    "depthwise_conv2d",
    "elu",
    "fused_batch_norm",
    "l2_normalize",
    "leaky_relu",
    "log_softmax",
    "max_pool",
    "relu",
    "relu6",
    "selu",
    "sigmoid",
    "softmax",
    "softmax_cross_entropy_with_logits",
    "softplus",
    "softsign",
    "sparse_softmax_cross_entropy_with_logits",
    "top_k",
]
