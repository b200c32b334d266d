"""pipeprof checking itself: does it give the right answer, and at what cost?

- ``calibrate``: workloads of known cost (a sample that burns X ms of CPU, a step of exactly Y ms)
- ``validate``:  ``pipeprof validate``, known-answer cases run end to end, verdicts and rate errors
- ``sizing``:    ``pipeprof validate --sizing``, re-running inside CPU masks to check the what-if
- ``bench``:     ``pipeprof bench ...``, benchmarks of pipeprof's own speed, repeatability and overheads
- ``watch_overhead``: ``pipeprof bench watch-overhead SCRIPT``, a training script plain and watched, timed by its
  progress lines
- ``action_known``: ``pipeprof bench action-trials``, action trials on known-cost sides against each side run
  alone
- ``regress``: ``pipeprof bench regress CONFIG --against RUN_DIR``, an old run's config run again beside CONFIG,
  A B B A, through the CI guard
- ``offload_check``: ``pipeprof bench offload-check``, the offload model's two-node prediction against a local Ray
  cluster of two nodes

May import anything below the command line; nothing in the package imports these but ``cli``
(and configs that name a ``calibrate`` workload by its import path).
"""
