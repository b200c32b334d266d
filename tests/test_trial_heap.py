"""What the sweep and a kept job's ranks do with the garbage collector between trials (``trials.heap``)."""

import gc
import weakref

import torch

from pipeprof.trials.heap import release, trial_heap

CPU = torch.device("cpu")


class Node:
    """An object the collector tracks, that can be made into a cycle."""


def _cycle() -> weakref.ref:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_what_a_trial_leaves_alive_is_set_aside_and_the_next_trials_cycles_are_still_freed():
    with trial_heap():
        before = gc.get_freeze_count()  # the heap as the block found it
        kept = [Node() for _ in range(5000)]  # what the first trial imports or keeps
        dead = _cycle()  # and a cycle it dropped
        release(CPU)
        assert dead() is None  # the trial's cycle was collected
        assert gc.get_freeze_count() >= before + 5000  # its survivors are set aside: the next collection skips them
        dead = _cycle()  # the next trial's cycle
        release(CPU)
        assert dead() is None
    assert gc.get_freeze_count() == 0  # all set back at the end
    del kept


def test_objects_the_process_froze_before_do_not_turn_it_off():
    """Python 3.12 starts with 375 objects frozen: a block that stood aside for any frozen object never set a
    trial's survivors aside there (every release walked the GPU run's 380,000 objects on the H200 box)."""
    early = [Node() for _ in range(100)]
    gc.freeze()  # as 3.12's start, or a server that froze its heap before forking
    with trial_heap():
        frozen = gc.get_freeze_count()
        kept = [Node() for _ in range(1000)]
        dead = _cycle()
        release(CPU)
        assert dead() is None and gc.get_freeze_count() >= frozen + 1000
        with trial_heap():  # nested: the outer block's policy, nothing set back early
            release(CPU)
        assert gc.get_freeze_count() >= frozen + 1000
    assert gc.get_freeze_count() == 0  # all set back, the earlier ones too
    del early, kept  # held to here: frozen while alive
