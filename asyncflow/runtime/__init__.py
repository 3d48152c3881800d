"""Running compiled plans: ``bind`` (kernels against a session's resources), one
executor ``Step`` per partition run with its propagator (plain or frames), the
rendezvous between partitions, the ``ExecutorBarrier``, call frames, cancellation,
devices and resources.  Imports the compiler's values, never the session.
"""
