"""Control-flow primitives (``af.raw_ops``), as TensorFlow's ``tf.raw_ops`` / v1 ops.

* ``switch(data, pred)`` → ``(output_false, output_true)``; the untaken one is dead.
* ``merge(inputs)`` → ``(output, value_index)``; the first live input wins.
* ``enter(data, frame_name, is_constant=False, parallel_iterations=10)``,
  ``exit(data)``, ``next_iteration(data)``, ``loop_cond(pred)``: loop frames.

Most code wants ``af.cond`` / ``af.case`` / ``af.while_loop``, built on these.
"""

from __future__ import annotations

from asyncflow.ops.control_flow_ops import enter, exit, loop_cond, merge, next_iteration, switch

__all__ = ["enter", "exit", "loop_cond", "merge", "next_iteration", "switch"]
