"""Planning and running a sweep: which trials, in what order, on how many processes.

- ``runner``:    :func:`execute`, a run from its config to its run folder (the CLI and the API both come here)
- ``sweep``:     expanding a config into trial specs and running them one by one, failures kept as rows
- ``search``:    the adaptive search over ``num_workers`` (what to measure next from what was measured)
- ``batchsize``: ``loader.batch_size: auto``, the largest batch that fits the device
- ``limits``:    settings checked against the machine before anything starts (workers, batch, memory)
- ``resume``:    finishing an interrupted run from the rows it kept
- ``merge``:     the nodes of a multi-machine job as one run
- ``action_trials``: the action trials after the answer (each applicable change of ``pipeprof.actions``
  tried against the baseline, within their budget)
- ``distributed``: the N-GPU launcher (a torchrun job per GPU count and p2p setting, one DDP rank per GPU)

May import: the nouns, ``data``, ``measure``, ``trials`` and ``analysis`` (the search reads measured
rows). Nothing here renders: ``report`` formats what a run stored.
"""
