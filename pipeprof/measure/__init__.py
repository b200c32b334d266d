"""What times and observes: the instruments every trial uses.

- ``windows``:     steady-state timing (warm-up until the rate settles, timed windows, median, CI, ABBA pairs)
- ``step``:        the train/inference step on a device, with its own clock and synchronisation
- ``loader``:      building the DataLoader the way a trial needs it (workers, samplers, a user's factory)
- ``monitors``:    the background sampler of CPU, GPU (NVML), disk and memory per process
- ``noise``:       attributing a trial's spread (steal time, other processes, the CPU reference's drift)
- ``reference``:   the fixed CPU workload whose drift says how fast this machine is right now
- ``decoders``:    both CPU decoders timed on the run's own files (the decoder action's basis)
- ``confounders``: thread caps and seeds of workers and the step, in one named place

May import: the nouns at the top of the package (``config``, ``env``, ``models``, ``schema``) and
``data``. Nothing here plans, analyses or prints.
"""
