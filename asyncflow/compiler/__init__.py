"""Pure compile passes: a graph's IR + a run signature -> immutable, picklable plans.

``prune`` → ``placement`` → ``optimize`` (constant folding, CSE, function inlining)
→ ``control_flow`` (frames; control loops for loops spanning devices) →
``partition`` (``_Send`` / ``_Recv``) → ``plan``, driven by
:func:`asyncflow.compiler.pipeline.compile_signature`.  Every pass is a synchronous
function from plain values (:mod:`asyncflow.compiler.ir`) to plain values, with no
graph, lock, kernel or event loop inside, so each is unit-tested alone, and a
compiled signature is cached, printed, pickled and shipped to other processes.
Kernels are bound afterwards, by :mod:`asyncflow.runtime.bind`; nothing here imports
the runtime.
"""
