"""The TensorFlow 1.x and Dask anchors, each run in a subprocess of its own.

``python -m benchmarks.external {tf,dask} SIZES_JSON WORKLOAD[,WORKLOAD...]`` prints
one JSON object (row id -> value, or ``{"error": ...}``) as its last stdout line.
Running them apart keeps TensorFlow's thread pools and import cost (and Dask's pool)
out of the process that measures asyncflow.  :func:`collect` is the parent's side.

The graphs are the ones asyncflow runs.  TensorFlow's graph optimizers (grappler and
the classic L1 pass: constant folding, CSE) are turned off so that every node of the
graph is executed, as in asyncflow's runs; the figure is the executor's cost per node.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import benchmarks  # noqa: F401  (pins BLAS threads before numpy is imported)
from benchmarks import cnn as model
from benchmarks.devices import xdev_note
from benchmarks.optimizer import tf_call
from benchmarks.process import Results, importable, peak_rss_mb, run_child
from benchmarks.sizes import Sizes, timed
from benchmarks.tf_anchor import tf_chain, tf_config, tf_v1

# --------------------------------------------------------------------------- parent side


def collect(engine: str, sizes: Sizes, workloads: list[str], timeout: float = 300.0) -> Results:
    """The anchor figures of ``engine`` ("tf" or "dask") for ``workloads``."""
    module = {"tf": "tensorflow", "dask": "dask"}[engine]
    if not importable(module):
        return {"_unavailable": f"{module} is not installed"}
    wanted = [w for w in workloads if w in _SUPPORTED[engine]]
    if not wanted:
        return {}
    return run_child(
        ["benchmarks.external", engine, json.dumps(sizes.to_json()), ",".join(wanted)], timeout
    )


# --------------------------------------------------------------------------- TensorFlow


@functools.cache
def tf_shared_chain(tf1: Any, n: int) -> tuple[Any, Any, Any]:
    """:func:`tf_chain`, built once per child process for the workloads that run it
    unchanged (chain, trace, trace.off): building 10,000 TF nodes takes ~2 s."""
    return tf_chain(tf1, n)


def tf_xdev_chain(tf1: Any, n: int, k: int) -> tuple[Any, Any, Any, int]:
    """The chain on /cpu:0 and /cpu:1, switching every ``k`` adds (as asyncflow's
    ``xdev`` graph: one constant per device, so only the chain's own device changes
    are cross-device edges, the 4th item)."""
    import numpy as np

    g = tf1.Graph()
    with g.as_default():
        x0 = tf1.placeholder(tf1.float32, shape=(), name="x")
        ones = []
        for d in range(2):
            with tf1.device(f"/cpu:{d}"):
                ones.append(tf1.constant(np.float32(1.0), name=f"one{d}"))
        x = x0
        for i in range(n):
            d = (i // k) % 2
            with tf1.device(f"/cpu:{d}"):
                x = x + ones[d]
    edges = sum(1 for i in range(1, n) if (i // k) % 2 != ((i - 1) // k) % 2)
    return g, x0, x, edges


def _tf_send_ops(tf1: Any, sess: Any, fetch: Any, feed: dict[Any, Any]) -> int:
    """How many _Send nodes the run's partition graphs hold."""
    opts = tf1.RunOptions(output_partition_graphs=True)
    md = tf1.RunMetadata()
    sess.run(fetch, feed, options=opts, run_metadata=md)
    return sum(node.op == "_Send" for pg in md.partition_graphs for node in pg.node)


def _tf_xdev(tf1: Any, s: Sizes, k: int) -> Results:
    """TF's side of ``xdev.k{k}``, measured as asyncflow's: the 2-device chain in us per
    op, its repeats interleaved with the same chain on one device; best repeat, and
    the medians and derived per-edge cost in the note."""
    n = s.chain_n
    g1, x1, y1 = tf_chain(tf1, n)
    g2, x2, y2, edges = tf_xdev_chain(tf1, n, k)
    config2 = tf_config(tf1)
    config2.device_count["CPU"] = 2
    with (
        tf1.Session(graph=g1, config=tf_config(tf1)) as s1,
        tf1.Session(graph=g2, config=config2) as s2,
    ):
        for sess, y, x in ((s1, y1, x1), (s2, y2, x2)):
            value = sess.run(y, {x: 0.0})
            if value != n:
                raise AssertionError(f"TF xdev chain computed {value!r}, expected {n}")
        sends = _tf_send_ops(tf1, s2, y2, {x2: 0.0})
        one_times: list[float] = []
        two_times: list[float] = []
        for _ in range(s.repeats):  # interleaved, as in asyncflow's run
            one_times.append(timed(lambda: s1.run(y1, {x1: 0.0})))
            two_times.append(timed(lambda: s2.run(y2, {x2: 0.0})))
    # TF's count is one more than the chain's edges when the fetched tensor is on
    # /cpu:1: the fetch travels to the client device through a pair of its own.
    extra = ": the fetch from /cpu:1 is one more" if sends > edges else ""
    return {
        f"xdev.k{k}": min(two_times) / n * 1e6,
        f"_note.xdev.k{k}": xdev_note(
            n,
            sends,
            two_times,
            one_times,
            who=f"TF 1.x ({sends:,} _Send/_Recv pairs in its partition graphs for the "
            f"chain's {edges:,} device changes{extra}): ",
        ),
    }


def _tf_best_of(sess: Any, fetch: Any, feed: dict[Any, Any], repeats: int) -> float:
    sess.run(fetch, feed)  # the first run compiles (executor creation): not timed
    return min(timed(lambda: sess.run(fetch, feed)) for _ in range(repeats))


def _tf_times(sess: Any, fetch: Any, feed: dict[Any, Any], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` runs, after an untimed first run."""
    sess.run(fetch, feed)  # the first run compiles (executor creation): not timed
    return [timed(lambda: sess.run(fetch, feed)) for _ in range(repeats)]


def _figures(out: Results, row_id: str, times: list[float], per: Callable[[float], float]) -> None:
    """``row_id``'s figure from its best repeat and, as ``_median.<row_id>``, from the
    median repeat (``per`` maps seconds to the row's unit, monotonically)."""
    out[row_id] = per(min(times))
    out[f"_median.{row_id}"] = per(statistics.median(times))


def tf_workload(name: str, s: Sizes) -> Results:
    """TF's figures for the workload ``name`` (none for a workload TF does not anchor)."""
    tf1 = tf_v1()
    if name.startswith("xdev.k"):
        return _tf_xdev(tf1, s, int(name.removeprefix("xdev.k")))
    measure = _TF_WORKLOADS.get(name)
    return {} if measure is None else measure(tf1, s)


def _tf_chain(tf1: Any, s: Sizes) -> Results:
    out: Results = {}
    g, x0, y = tf_shared_chain(tf1, s.chain_n)
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        times = _tf_times(sess, y, {x0: 0.0}, s.repeats)
    _figures(out, "chain", times, lambda t: t / s.chain_n * 1e6)
    return out


def _tf_wide(tf1: Any, s: Sizes) -> Results:
    import numpy as np

    out: Results = {}
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf1.float32, shape=(), name="x")
        one = tf1.constant(np.float32(1.0), name="one")
        y = tf1.add_n([x + one for _ in range(s.wide_n)])
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        times = _tf_times(sess, y, {x: 1.0}, s.repeats)
    _figures(out, "wide", times, lambda t: t / s.wide_n * 1e6)
    return out


def _tf_tiny(tf1: Any, s: Sizes) -> Results:
    out: Results = {}
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf1.float32, shape=(), name="x")
        y = (x + 1.0) * 2.0
    # Default config here: this is what a TF user's session.run costs.
    with tf1.Session(graph=g) as sess:
        sess.run(y, {x: 1.0})

        def calls() -> None:
            for _ in range(s.tiny_calls):
                sess.run(y, {x: 1.0})

        times = [timed(calls) for _ in range(s.repeats)]
    # TF has one (synchronous) session.run: it anchors both rows.
    for row_id in ("tiny.run", "tiny.run_sync"):
        _figures(out, row_id, times, lambda t: t / s.tiny_calls * 1e6)
    return out


def _tf_parallel(tf1: Any, s: Sizes) -> Results:
    import numpy as np

    rng = np.random.default_rng(0)
    d = s.matmul_dim
    w_val = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    a_val = rng.standard_normal((d, d)).astype(np.float32)
    g = tf1.Graph()
    with g.as_default():
        a = tf1.placeholder(tf1.float32, shape=(d, d), name="a")
        w = tf1.constant(w_val, name="w")
        heads = []
        for _ in range(2):
            h = a
            for _ in range(s.matmul_chain):
                h = tf1.matmul(h, w)
            heads.append(h)
    # Both sessions open at once and their repeats alternate, so a burst of
    # load from elsewhere hits both configurations alike.
    s1 = tf1.Session(graph=g, config=tf_config(tf1, inter=1, intra=1))
    s2 = tf1.Session(graph=g, config=tf_config(tf1, inter=2, intra=1))
    try:
        feed = {a: a_val}
        by_inter: dict[int, list[float]] = {1: [], 2: []}
        for sess in (s1, s2):
            sess.run(heads, feed)
        for _ in range(s.slow_repeats):
            by_inter[1].append(timed(lambda: s1.run(heads, feed)))
            by_inter[2].append(timed(lambda: s2.run(heads, feed)))
    finally:
        s1.close()
        s2.close()
    return {
        "parallel": min(by_inter[1]) / min(by_inter[2]),
        "_median.parallel": statistics.median(by_inter[1]) / statistics.median(by_inter[2]),
    }


def _tf_opt_call(tf1: Any, s: Sizes) -> Results:
    return {
        "opt.call.inlined": tf_call(tf1, s, inline=True),
        "opt.call.kernel": tf_call(tf1, s, inline=False),
        "_note.opt.call.inlined": (
            "TF 1.x: function.Defun chain, grappler off, do_function_inlining on / off"
        ),
    }


def _tf_cnn(tf1: Any, s: Sizes) -> Results:
    """asyncflow's cnn workload: the same model and weights (benchmarks.cnn) in a TF 1.x
    graph, run with the default session config (grappler and TF's intra-op threads on:
    what a TF user gets)."""
    import numpy as np

    p = model.weights(s.cnn_image)
    x_val = model.images(s.cnn_batch, s.cnn_image)
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf1.float32, (None, s.cnn_image, s.cnn_image, 3), name="images")
        probs = model.build(tf1.nn, tf1, x, p)
    one_thread = tf1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    one_thread.use_per_session_threads = True
    with tf1.Session(graph=g) as sess, tf1.Session(graph=g, config=one_thread) as single:
        for session in (sess, single):
            got = session.run(probs, {x: x_val})
            if not np.allclose(got, model.numpy_forward(x_val, p), rtol=1e-4, atol=1e-6):
                raise AssertionError("TF's CNN probabilities differ from numpy's")
        times = _tf_times(sess, probs, {x: x_val}, s.repeats)
        best_single = _tf_best_of(single, probs, {x: x_val}, s.repeats)
    best = min(times)
    return {
        "cnn": best * 1e3,
        "_median.cnn": statistics.median(times) * 1e3,
        "_note.cnn": f"TF 1.x cnn: default ConfigProto (intra-op threads = cores); "
        f"with 1 inter- and 1 intra-op thread {best_single * 1e3:.2f} "
        f"ms/batch (asyncflow's BLAS is pinned to 1 thread here)",
    }


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """Move every object alive now (TensorFlow's modules, the graphs just built) out of
    the collector's reach until the block ends: the ``gc.collect()`` that
    :func:`~benchmarks.sizes.timed` runs before each repeat then takes milliseconds
    instead of ~0.15 s in a TF process.  The collection is never timed, but a big one
    leaves the caches cold for the first moments of the timed block: that is ~0.6 ms,
    <1% of a callable row's ~80 ms block, but ~30% of one 10,000-node chain run, so
    only the callable anchors use this."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _tf_callable(tf1: Any, s: Sizes, nested: bool) -> Results:
    """asyncflow's callable workloads: ``sess.make_callable(fetches, feed_list)`` per
    call, interleaved with ``sess.run(fetches, feed_dict)`` (default config, as tiny)."""
    row_id = "callable.nested" if nested else "callable"
    calls = s.tf_callable_calls
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf1.float32, shape=(), name="x")
        y = (x + 1.0) * 2.0
        values: tuple[float, ...]
        if nested:
            w = tf1.placeholder(tf1.float32, shape=(), name="w")
            z = y * w
            fetches: Any = {"a": [y, z], "b": (y,)}
            feed_list, values = [x, w], (1.0, 3.0)
            expected: Any = {"a": [4.0, 12.0], "b": (4.0,)}
        else:
            fetches, feed_list, values, expected = y, [x], (1.0,), 4.0
    feed = dict(zip(feed_list, values))
    with tf1.Session(graph=g) as sess, _frozen_heap():
        fn = sess.make_callable(fetches, feed_list=feed_list)
        for got in (sess.run(fetches, feed), fn(*values)):
            if got != expected:
                raise AssertionError(f"TF {row_id} computed {got!r}, expected {expected!r}")

        def run_calls() -> None:
            for _ in range(calls):
                sess.run(fetches, feed)

        def callable_calls() -> None:
            for _ in range(calls):
                fn(*values)

        runs, fns = [], []
        for _ in range(s.repeats):
            runs.append(timed(run_calls))
            fns.append(timed(callable_calls))
    per_fn, per_run = min(fns) / calls * 1e6, min(runs) / calls * 1e6
    return {
        row_id: per_fn,
        f"_median.{row_id}": statistics.median(fns) / calls * 1e6,
        f"_note.{row_id}": f"TF 1.x: make_callable {per_fn:.1f} us/call vs its "
        f"session.run {per_run:.1f} us/run ({per_fn / per_run:.2f}x; "
        f"default config, as tiny.run's TF anchor; best of "
        f"{s.repeats} x {calls:,} calls each)",
    }


def _tf_trace(tf1: Any, s: Sizes, traced: bool) -> Results:
    """asyncflow's trace / trace.off workloads on TF's chain (optimizers off): the run
    with ``RunOptions(trace_level=FULL_TRACE)`` and a RunMetadata (trace) or with
    ``RunOptions()`` and no RunMetadata (trace.off), interleaved with the plain run."""
    row_id = "trace" if traced else "trace.off"
    n = s.chain_n
    g, x0, y = tf_shared_chain(tf1, n)
    feed = {x0: 0.0}
    opts = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE) if traced else tf1.RunOptions()
    # No _frozen_heap here: a full collection just before a 2-3 ms run leaves the
    # caches cold, and the chain row's TF figure is measured that way too.
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        sess.run(y, feed)  # executor creation: not timed
        md = tf1.RunMetadata()
        value = sess.run(y, feed, options=opts, run_metadata=md if traced else None)
        if value != n:
            raise AssertionError(f"TF {row_id} chain computed {value!r}, expected {n}")
        recorded = sum(len(d.node_stats) for d in md.step_stats.dev_stats)
        plains, optss = [], []
        for _ in range(s.repeats):
            plains.append(timed(lambda: sess.run(y, feed)))
            optss.append(
                timed(
                    lambda: sess.run(
                        y, feed, options=opts, run_metadata=tf1.RunMetadata() if traced else None
                    )
                )
            )
        t_plain, t_opts = min(plains), min(optss)
    what = (
        f"FULL_TRACE with a RunMetadata ({recorded:,} node stats recorded)"
        if traced
        else "options=RunOptions(), run_metadata=None"
    )
    return {
        row_id: t_opts / n * 1e6,
        f"_median.{row_id}": statistics.median(optss) / n * 1e6,
        f"_note.{row_id}": f"TF 1.x: {what} {t_opts / n * 1e6:.2f} us/node vs its plain "
        f"run {t_plain / n * 1e6:.2f} us/node "
        f"({t_opts / t_plain:.2f}x)",
    }


def _run_threads(
    targets: Sequence[Callable[[], None]],
    timeout: float,
    on_timeout: Callable[[], None] = lambda: None,
) -> float:
    """Seconds for threads running ``targets`` to finish; the first exception raised
    in one of them is re-raised here, and a thread still running after ``timeout``
    (``on_timeout`` is called to unblock it) is an error."""
    import gc
    import threading

    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guarded(fn), daemon=True) for fn in targets]
    gc.collect()
    start = time.perf_counter()
    for t in threads:
        t.start()
    deadline = start + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    elapsed = time.perf_counter() - start
    if any(t.is_alive() for t in threads):
        on_timeout()
        for t in threads:
            t.join(10.0)
        raise TimeoutError(f"threads still running after {timeout:.0f} s")
    if errors:
        raise errors[0]
    return elapsed


def _tf_queue(tf1: Any, s: Sizes) -> Results:
    """asyncflow's queue workload: one element per enqueue step, one per dequeue step,
    from producer and consumer threads sharing one session (TF sessions are
    thread-safe; a full or empty queue blocks the calling thread)."""
    total, producers, consumers = s.queue_n, s.queue_producers, s.queue_consumers
    shares = [total // consumers + (1 if k < total % consumers else 0) for k in range(consumers)]
    g = tf1.Graph()
    with g.as_default():
        x = tf1.placeholder(tf1.int32, shape=(), name="x")
        q = tf1.queue.FIFOQueue(s.queue_capacity, tf1.int32, shapes=[()])
        enq, deq, size = q.enqueue(x), q.dequeue(), q.size()
        close = q.close(cancel_pending_enqueues=True)
    times: list[float] = []
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        sess.run(enq, {x: 7})  # executor creation: not timed
        if sess.run(deq) != 7:
            raise AssertionError("TF queue: the warm-up element did not come back")

        def produce(k: int) -> None:
            for i in range(k, total, producers):
                sess.run(enq, {x: i})

        def consume(out: list[int], n: int) -> None:
            for _ in range(n):
                out.append(int(sess.run(deq)))

        for _ in range(s.state_repeats):
            received: list[list[int]] = [[] for _ in range(consumers)]
            elapsed = _run_threads(
                [functools.partial(produce, k) for k in range(producers)]
                + [functools.partial(consume, out, n) for out, n in zip(received, shares)],
                timeout=60.0,
                on_timeout=lambda: sess.run(close),
            )
            got = sorted(v for part in received for v in part)
            if got != list(range(total)) or sess.run(size) != 0:
                raise AssertionError(
                    f"TF queue: {len(got):,} elements received for "
                    f"{total:,} sent, or some left in the queue"
                )
            times.append(elapsed)
    best = min(times)
    return {
        "queue": total / best,
        "_median.queue": total / statistics.median(times),
        "_note.queue": f"TF 1.x: tf.queue.FIFOQueue({s.queue_capacity}), "
        f"{producers} producer + {consumers} consumer threads on one "
        f"session, every element exactly once; best run {best:.2f} s "
        f"({best / total * 1e6:.1f} us per element)",
    }


def _tf_variable(tf1: Any, s: Sizes) -> Results:
    """asyncflow's variable workload: ``assign_add(1)`` steps from threads sharing one
    session (TF's steps block their thread: threads, not 100 tasks, run them)."""
    total, threads = s.variable_n, s.tf_variable_threads
    shares = [total // threads + (1 if k < total % threads else 0) for k in range(threads)]
    g = tf1.Graph()
    with g.as_default():
        v = tf1.Variable(0, name="v")
        inc = v.assign_add(1)
        init = v.initializer
    times: list[float] = []
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        sess.run(init)
        sess.run(inc)  # executor creation: not timed

        def steps(n: int) -> None:
            for _ in range(n):
                sess.run(inc)

        for _ in range(s.state_repeats):
            sess.run(init)

            elapsed = _run_threads([functools.partial(steps, n) for n in shares], timeout=60.0)
            value = sess.run(v)
            if value != total:
                raise AssertionError(f"TF variable ended at {value!r}, expected {total}")
            times.append(elapsed)
    best = min(times)
    return {
        "variable": total / best,
        "_median.variable": total / statistics.median(times),
        "_note.variable": f"TF 1.x: {threads} threads running assign_add steps on one "
        f"session, ended exactly at {total:,}; best run {best:.2f} s "
        f"({best / total * 1e6:.1f} us per step)",
    }


def _tf_loop(tf1: Any, s: Sizes, with_cond: bool) -> Results:
    """asyncflow's loop workload: ``tf.while_loop`` over ``i < n`` with the same body
    (``s + 1.0``, or through a ``tf.cond`` on i's parity) and parallel_iterations."""
    import numpy as np

    row_id = "loop.cond" if with_cond else "loop"
    n = s.loop_cond_n if with_cond else s.loop_n

    def body(i: Any, acc: Any) -> tuple[Any, Any]:
        if not with_cond:
            return i + 1, acc + 1.0
        even = tf1.equal(i % 2, 0)
        return i + 1, tf1.cond(even, lambda: acc + 1.0, lambda: acc - 1.0)

    g = tf1.Graph()
    with g.as_default():
        n_ph = tf1.placeholder(tf1.int32, shape=(), name="n")
        fetches = tf1.while_loop(
            lambda i, acc: i < n_ph,
            body,
            (tf1.constant(0), tf1.constant(np.float32(0.0))),
            parallel_iterations=s.loop_parallel_iterations,
        )
    expected = (n, float(n % 2 if with_cond else n))
    with tf1.Session(graph=g, config=tf_config(tf1)) as sess:
        sess.run(fetches, {n_ph: 100})  # executor creation: not timed
        value = sess.run(fetches, {n_ph: n})
        if (int(value[0]), float(value[1])) != expected:
            raise AssertionError(f"TF {row_id} computed {value!r}, expected {expected!r}")
        times = [timed(lambda: sess.run(fetches, {n_ph: n})) for _ in range(s.repeats)]
    best = min(times)
    return {
        row_id: best / n * 1e6,
        f"_median.{row_id}": statistics.median(times) / n * 1e6,
        f"_note.{row_id}": f"TF 1.x: tf.compat.v1.while_loop, parallel_iterations="
        f"{s.loop_parallel_iterations}; best run {best:.2f} s",
    }


def _tf_parallel_2dev(tf1: Any, s: Sizes) -> Results:
    """The parallel graph with chain c on /cpu:c, inter_op_parallelism_threads=1, vs
    the one-device graph with one thread (asyncflow's parallel.2dev)."""
    import numpy as np

    rng = np.random.default_rng(0)
    d = s.matmul_dim
    w_val = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    a_val = rng.standard_normal((d, d)).astype(np.float32)
    graphs = {}
    for devices in (1, 2):
        g = tf1.Graph()
        with g.as_default():
            a = tf1.placeholder(tf1.float32, shape=(d, d), name="a")
            heads = []
            for c in range(2):
                with tf1.device(f"/cpu:{c if devices == 2 else 0}"):
                    w = tf1.constant(w_val, name=f"w{c}")
                    h = a
                    for _ in range(s.matmul_chain):
                        h = tf1.matmul(h, w)
                    heads.append(h)
        config = tf_config(tf1, inter=1, intra=1)
        config.device_count["CPU"] = devices
        graphs[devices] = (tf1.Session(graph=g, config=config), heads, {a: a_val})
    try:
        times: dict[int, list[float]] = {1: [], 2: []}
        for sess, heads, feed in graphs.values():
            sess.run(heads, feed)
        for _ in range(s.slow_repeats):
            for devices, (sess, heads, feed) in graphs.items():
                times[devices].append(timed(functools.partial(sess.run, heads, feed)))
    finally:
        for sess, _, _ in graphs.values():
            sess.close()
    return {
        "parallel.2dev": min(times[1]) / min(times[2]),
        "_median.parallel.2dev": statistics.median(times[1]) / statistics.median(times[2]),
        "_note.parallel.2dev": f"TF 1.x best step: 1 device {min(times[1]) * 1e3:.1f} ms,"
        f" 2 devices {min(times[2]) * 1e3:.1f} ms (TF's "
        f"DirectSession runs every device's kernels on the "
        f"session's one inter-op pool: 1 thread for both)",
    }


#: TF's side of each workload it anchors (``xdev.k<k>`` is parameterized: see
#: :func:`tf_workload`).
_TF_WORKLOADS: dict[str, Callable[[Any, Sizes], Results]] = {
    "chain": _tf_chain,
    "wide": _tf_wide,
    "tiny": _tf_tiny,
    "callable": functools.partial(_tf_callable, nested=False),
    "callable.nested": functools.partial(_tf_callable, nested=True),
    "trace": functools.partial(_tf_trace, traced=True),
    "trace.off": functools.partial(_tf_trace, traced=False),
    "parallel": _tf_parallel,
    "parallel.2dev": _tf_parallel_2dev,
    "loop": functools.partial(_tf_loop, with_cond=False),
    "loop.cond": functools.partial(_tf_loop, with_cond=True),
    "queue": _tf_queue,
    "variable": _tf_variable,
    "cnn": _tf_cnn,
    "opt.call": _tf_opt_call,
}


# --------------------------------------------------------------------------- Dask


def dask_workload(name: str, s: Sizes) -> Results:
    import dask.threaded
    import numpy as np

    one = np.float32(1.0)
    get: Callable[..., Any] = dask.threaded.get
    out: Results = {}

    def best(dsk: dict[str, Any], key: Any, repeats: int, **kw: Any) -> float:
        get(dsk, key, **kw)
        return min(timed(lambda: get(dsk, key, **kw)) for _ in range(repeats))

    if name == "chain":
        n = s.chain_n
        dsk: dict[str, Any] = {"x0": np.float32(0.0)}
        for i in range(n):
            dsk[f"x{i + 1}"] = (np.add, f"x{i}", one)
        out["chain"] = best(dsk, f"x{n}", s.slow_repeats) / n * 1e6
    elif name == "wide":
        n = s.wide_n
        dsk = {"x": np.float32(1.0)}
        for i in range(n):
            dsk[f"a{i}"] = (np.add, "x", one)
        dsk["sum"] = (_add_n, [f"a{i}" for i in range(n)])
        out["wide"] = best(dsk, "sum", s.slow_repeats) / n * 1e6
    elif name == "tiny":
        dsk = {
            "x": np.float32(1.0),
            "y": (np.add, "x", np.float32(1.0)),
            "z": (np.multiply, "y", np.float32(2.0)),
        }

        def calls() -> None:
            for _ in range(s.tiny_calls):
                get(dsk, "z")

        get(dsk, "z")
        per_run = min(timed(calls) for _ in range(s.repeats)) / s.tiny_calls * 1e6
        out["tiny.run"] = out["tiny.run_sync"] = per_run
    elif name == "parallel":
        dsk, heads = _dask_matmul_chains(s)
        t1 = t2 = float("inf")
        for _ in range(s.slow_repeats):  # alternating, as for TensorFlow
            t1 = min(t1, best(dsk, heads, 1, num_workers=1))
            t2 = min(t2, best(dsk, heads, 1, num_workers=2))
        out["parallel"] = t1 / t2
    return out


def _dask_matmul_chains(s: Sizes) -> tuple[dict[str, Any], list[str]]:
    """The parallel workload's graph: two independent matmul chains (and their heads)."""
    import numpy as np

    rng = np.random.default_rng(0)
    d = s.matmul_dim
    w = (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
    dsk: dict[str, Any] = {"a": rng.standard_normal((d, d)).astype(np.float32), "w": w}
    heads = []
    for c in range(2):
        prev = "a"
        for i in range(s.matmul_chain):
            dsk[f"c{c}_{i}"] = (np.matmul, prev, "w")
            prev = f"c{c}_{i}"
        heads.append(prev)
    return dsk, heads


def _add_n(values: list[Any]) -> Any:
    import numpy as np

    return np.sum(values, dtype=np.float32)


_SUPPORTED = {
    "tf": {
        "chain",
        "xdev.k1",
        "xdev.k100",
        "wide",
        "tiny",
        "callable",
        "callable.nested",
        "opt.call",
        "trace",
        "trace.off",
        "parallel",
        "parallel.2dev",
        "loop",
        "loop.cond",
        "queue",
        "variable",
        "cnn",
        "scale",
    },
    "dask": {"chain", "wide", "tiny", "parallel"},
}


# --------------------------------------------------------------------------- child side


def main(argv: list[str]) -> int:
    engine, sizes_json, names = argv
    sizes = Sizes.from_json(json.loads(sizes_json))
    fn = {"tf": tf_workload, "dask": dask_workload}[engine]
    results: Results = {}
    for name in names.split(","):
        if name == "scale":
            continue  # its own subprocess: see benchmarks.scale
        start = time.perf_counter()
        try:
            results.update(fn(name, sizes))
        except Exception as exc:  # report the anchor as broken, keep the others
            results[f"_error.{name}"] = f"{type(exc).__name__}: {exc}"
        results[f"_seconds.{name}"] = time.perf_counter() - start
    results["_peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
