"""Pipeline schedules: the order in which one stage runs its micro-batches' passes.

A schedule is a list of ``("F", i)`` (forward of micro-batch ``i``) and ``("B", i)``
(its backward). Every stage runs its own list; activations flow down and gradients
up, so stage ``s`` can start micro-batch ``i`` as soon as stage ``s-1`` has sent it,
and the stages work in parallel.

>>> gpipe(0, 2, 3)
[('F', 0), ('F', 1), ('F', 2), ('B', 0), ('B', 1), ('B', 2)]
>>> one_f_one_b(0, 2, 3)
[('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]

GPipe (fill, then drain) keeps every micro-batch's activations until its backward;
1F1B starts backward passes as early as possible, so a stage holds at most
``stages - stage`` micro-batches at once. Both leave the same bubble; both
accumulate gradients in micro-batch order, so the result does not depend on timing.
"""

__all__ = ["SCHEDULES", "gpipe", "one_f_one_b", "forward_only"]


def gpipe(stage, stages, micro_batches):
    """All forwards, then all backwards (GPipe's fill and drain)."""
    return ([("F", i) for i in range(micro_batches)]
            + [("B", i) for i in range(micro_batches)])


def one_f_one_b(stage, stages, micro_batches):
    """Warm up with ``stages - stage - 1`` forwards, then alternate one forward, one backward."""
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    backward = 0
    for forward in range(warmup, micro_batches):
        order += [("F", forward), ("B", backward)]
        backward += 1
    order += [("B", i) for i in range(backward, micro_batches)]
    return order


def forward_only(stage, stages, micro_batches):
    """Evaluation: forwards only."""
    return [("F", i) for i in range(micro_batches)]


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}
