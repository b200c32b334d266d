"""What the sweep does with the garbage collector between trials (``sweep.trial_heap`` and ``sweep.release``)."""
import gc
import weakref

import torch

from pipeprof.orchestrate.sweep import release, trial_heap

CPU = torch.device("cpu")


class Node:
    """An object the collector tracks, that can be made into a cycle."""


def _cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_a_trial_leaves_alive_is_set_aside_and_the_next_trials_cycles_are_still_freed():
    assert gc.get_freeze_count() == 0  # pytest's process froze nothing: trial_heap's own policy applies
    with trial_heap():
        before = gc.get_freeze_count()  # the heap as the block found it
        kept = [Node() for _ in range(5000)]  # what the first trial imports or keeps
        dead = _cycle()  # and a cycle it dropped
        release(CPU)
        assert dead() is None  # the trial's cycle was collected
        assert gc.get_freeze_count() >= before + 5000  # its survivors are set aside: the next collection skips them
        assert all(gc.is_tracked(n) for n in kept[:3])
        dead = _cycle()  # the next trial's cycle
        release(CPU)
        assert dead() is None
    assert gc.get_freeze_count() == 0  # all set back at the end
    del kept


def test_a_process_that_froze_objects_of_its_own_keeps_its_policy():
    gc.freeze()
    try:
        mine = gc.get_freeze_count()
        with trial_heap():
            kept = [Node() for _ in range(100)]
            release(CPU)
            assert gc.get_freeze_count() == mine  # nothing frozen on its behalf
        assert gc.get_freeze_count() == mine and len(kept) == 100
    finally:
        gc.unfreeze()
