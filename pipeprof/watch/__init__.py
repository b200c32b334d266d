"""Observing a user's own command: ``pipeprof watch [--seconds S | --steps N] [--tune] -- COMMAND ...``.

In the watched processes (stdlib only until a pause):

- ``boot``:     a folder put first on PYTHONPATH holding only ``sitecustomize.py``: loads the hook by
  file path in every Python process of the job and runs the sitecustomize the job had before
- ``hook``:     patches ``torch.utils.data`` once it is imported: each DataLoader's settings and
  construction site, the wait and the step of every ``next()`` (CUDA events read with ``query()``)
- ``sites``:    where the user built a loader: their own frame, the library's beside it, the argparse option
- ``channel``:  JSON lines over a Unix socket, both ends (the child's buffered client, the parent's server)
- ``pause``:    ``--tune`` inside the process: the loop paused at a step boundary (the job's workers stopped),
  copies of the loader timed alone with ``measure.windows`` at the worker counts the parent asks for, and
  its hand-off over one prebuilt sample
- ``pause_actions``: the actions tried in the pause: changed copies of the loader (``data.user_actions``,
  the DataLoader's knobs), each read alone with the user's loader read before and after it

In ``pipeprof watch`` itself:

- ``session``:  the parent: starts the command, listens, runs the monitor, ends the window, drives the pause
- ``records``:  the messages kept, steady-state windows of each loader's batches, end_to_end and step rows
- ``procs``:    CPU per process of the job (a rank's training process, a loader's workers)
- ``tune``:     which worker counts the pause measures (``orchestrate.search``) and the recommendation
  (``analysis.predict``, ``recommend_workers``, ``cores_needed``)
- ``framework_snippets``: a tried action's code in the terms of the framework the loader came from (timm's
  ``create_loader``, Lightning's ``train_dataloader`` and batch hooks)
- ``answer``:   the analysis of the rows with ``analysis.analyse`` per loader, the slowest rank
- ``folder``:   the run folder of kind ``watch`` (rows, batches, timeline, run.json)
- ``live``:     the live line and the closing summary; ``page``: report.html with the watch's answer on top

May import: anything below the command line (``measure``, ``orchestrate.search``, ``analysis``, ``results``,
``report``); the modules loaded in the watched processes (``hook``, ``channel``) import nothing of
pipeprof, and ``pause`` (with ``pause_actions``) only what measures a loader (``measure``, ``trials``,
``data``). Only ``cli`` and ``checks.bench`` import this folder.
"""
