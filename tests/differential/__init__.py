"""Differential testing: random programs run by asyncflow and by independent oracles.

``python -m tests.differential --tf N`` runs N programs against TensorFlow 1.x and
prints an agreement table by category; ``tests/differential/test_differential.py``
runs the numpy reference oracle in CI.  See :mod:`.programs` and :mod:`.oracles`.
"""
