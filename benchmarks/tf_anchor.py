"""TensorFlow 1.x as the anchor engine: graph mode set up, a session config with every
graph optimizer off, and the scalar chain.  TensorFlow is imported only when
:func:`tf_v1` is called (it is an optional anchor, never a dependency)."""

from __future__ import annotations

from typing import Any


def tf_v1() -> Any:
    """``tf.compat.v1`` with eager execution off."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    return tf1


def tf_config(tf1: Any, inter: int = 0, intra: int = 0) -> Any:
    """A ConfigProto with every graph optimizer off (see the module docstring)."""
    config = tf1.ConfigProto(inter_op_parallelism_threads=inter, intra_op_parallelism_threads=intra)
    # Without this, the first session's pool sizes are the process's for good.
    config.use_per_session_threads = bool(inter or intra)
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    opts = config.graph_options.optimizer_options
    opts.opt_level = tf1.OptimizerOptions.L0
    opts.do_common_subexpression_elimination = False
    opts.do_constant_folding = False
    opts.do_function_inlining = False
    return config


def tf_chain(tf1: Any, n: int) -> tuple[Any, Any, Any]:
    """(graph, placeholder, output) of ``x = x + one`` repeated ``n`` times."""
    import numpy as np

    g = tf1.Graph()
    with g.as_default():
        x0 = tf1.placeholder(tf1.float32, shape=(), name="x")
        one = tf1.constant(np.float32(1.0), name="one")
        x = x0
        for _ in range(n):
            x = x + one
    return g, x0, x
