"""Observing a step: tracing (``FULL_TRACE``), progress events and streamed retvals.

One vocabulary.  An *observer* wants to know what a step's kernels do; it never asks
the engines to run differently.  It *observes* a bound plan: it gets an *observed
copy* of the plan (:func:`hook.observed`) in which some kernels are wrapped, and the
step runs that copy exactly as it runs the plan (the same engine, task mode and
hand-offs).  What the wrapper of a node records is a :class:`hook.Probe` (called
before the kernel, after it returned, and if it raised); every kind of kernel
(inline, worker thread, async, send, recv) is wrapped in one place,
:func:`hook.observe_node`.  A step nobody observes runs the plan's own kernels and
pays nothing.

The observers, each a module with one ``observe_*`` entry point:

* :mod:`.trace` — ``observe_trace(plan)``: the kernels of a traced step record when
  they ran into the step's :class:`~.trace.StepTrace`, made into TF's step stats
  when ``RunMetadata.step_stats`` is read;
* :mod:`.progress` — ``ProgressObserver(callback).observe(plan)``: kernels count
  themselves for ``RunOptions(progress=callback)``;
* :mod:`.retvals` — ``observe_retvals(plan, notify, loop)``: the kernels producing a
  fetched value report it, for ``Session.run_stream``.

What they hand to the user (``StepStats`` and its parts, ``ProgressEvent``) are
plain values defined beside ``RunOptions`` and ``RunMetadata`` in
:mod:`asyncflow.config`, below the runtime (the configuration is imported by the
runtime, never the other way round); ``asyncflow.tracing`` (public) turns step stats
into a Chrome trace.

This package imports nothing itself: import the module you need.
"""
