"""The schedules a launch's pipeline runs (``pipeline.schedule``), by their config names.

They are ``distgrad.distributed.pipelining``'s schedule classes, under PyTorch's names in
lower case: the orders, the executor and the split backward are the same code for a
launch and for a program written against ``torch.distributed.pipelining``.

>>> schedule_class("zbvzerobubble").__name__, split_backward("zbvzerobubble")
('ScheduleZBVZeroBubble', True)
>>> stage_indices("interleaved1f1b", rank=1, ranks=2, virtual=2)
[1, 3]
>>> gpipe(0, 2, 3)
[('F', 0), ('F', 1), ('F', 2), ('B', 0), ('B', 1), ('B', 2)]
>>> one_f_one_b(0, 2, 3)
[('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]

Every stage accumulates its micro-batches' gradients in micro-batch order, except Looped
BFS (in reverse): the one-process run (``local.py``) follows the same order, so the sums
agree bit for bit.
"""
from distgrad.distributed.pipelining import orders
from distgrad.distributed.pipelining._utils import generate_rank_to_stage_mapping
from distgrad.distributed.pipelining.actions import B, F
from distgrad.distributed.pipelining.schedules import (PipelineScheduleSingle, Schedule1F1B,
                                                       get_schedule_class)

__all__ = ["NAMES", "schedule_class", "split_backward", "stage_indices", "check",
           "backward_reversed", "SCHEDULES", "gpipe", "one_f_one_b"]

#: ``pipeline.schedule`` values; the first two run one stage per worker
NAMES = ("gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "interleavedzerobubble",
         "zbvzerobubble", "dualpipev")
_ONE_STAGE = ("gpipe", "1f1b")
_V = ("zbvzerobubble", "dualpipev")
_SPLIT = ("interleavedzerobubble", "zbvzerobubble", "dualpipev")


class _OneFOneB(PipelineScheduleSingle):
    """Schedule1F1B's order, also with fewer micro-batches than stages (the class refuses
    those, as PyTorch's does; a launch has always run them: the order then fills and
    drains as GPipe's does)."""

    _get_pipeline_order = Schedule1F1B._get_pipeline_order


def schedule_class(name):
    return _OneFOneB if name == "1f1b" else get_schedule_class(name)


def split_backward(name):
    """Whether the schedule splits backward passes into I and W (zero-bubble ones)."""
    return name in _SPLIT


def backward_reversed(name):
    return name == "loopedbfs"


def stage_indices(name, rank, ranks, virtual):
    """The stages of worker ``rank`` of a pipeline of ``ranks`` workers."""
    style = "v" if name in _V else "loop"
    return generate_rank_to_stage_mapping(ranks, ranks * virtual, style)[rank]


def check(name, ranks, virtual, micro_batches):
    """Why ``name`` cannot run ``virtual`` stages per worker on ``ranks`` workers with
    ``micro_batches`` (a sentence naming the key at fault), or None."""
    if name in _ONE_STAGE and virtual != 1:
        return (f"pipeline.virtual_stages {virtual}: {name!r} runs one stage per worker; "
                "more need interleaved1f1b, loopedbfs, interleavedzerobubble, zbvzerobubble "
                "or dualpipev")
    if name in _V and virtual != 2:
        return f"pipeline.virtual_stages {virtual}: {name!r} runs exactly 2 stages per worker"
    if name == "dualpipev" and micro_batches < 2 * ranks:
        return (f"pipeline.micro_batches {micro_batches}: dualpipev needs at least one per "
                f"stage ({2 * ranks})")
    if name in ("interleaved1f1b", "interleavedzerobubble"):
        try:
            orders.rounds_of(micro_batches, ranks, name)
        except ValueError as e:
            return f"pipeline.micro_batches {micro_batches}: {e}"
    return None


def _kinds(order):
    return [(a.computation_type.value, a.microbatch_index) for a in order
            if a is not None and a.computation_type in (F, B)]


def gpipe(stage, stages, micro_batches):
    """All forwards, then all backwards (GPipe's fill and drain), as (kind, micro-batch)."""
    return _kinds(orders.gpipe(stage, stages, micro_batches))


def one_f_one_b(stage, stages, micro_batches):
    """``stages - stage`` forwards, then one backward and one forward in turn."""
    return _kinds(orders.one_f_one_b(stage, stages, micro_batches))


#: the one-stage-per-worker orders, as (kind, micro-batch) lists
SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}
