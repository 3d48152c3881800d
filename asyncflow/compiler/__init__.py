"""Pure compile passes: graph + run signature → immutable plan.

``prune`` → ``placement`` → ``plan``.  Every pass is a synchronous function of its
inputs, with no event loop and no per-step state, so each is unit-tested alone and
a plan compiled once is shared by every concurrent step of its signature.
(Optimization passes and multi-device partitioning plug in between placement and
plan; see DESIGN.md.)
"""
