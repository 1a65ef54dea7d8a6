"""The first step's introduction between neighbouring stages.

Before its first step, each stage tells the stage on each side (on another rank: one
message each way per boundary) what it was built with: the schedule, the number of
stages and micro-batches and of ranks, and the shapes it declared (``output_args`` to
the stage after, ``input_args`` to the stage before). Ranks that disagree on the
pipeline fail here, on both sides of the boundary and naming both, instead of waiting for
messages that never come; declared shapes that disagree raise
:class:`PipeliningShapeError` with both stages and both shapes; and a stage learns what
the next one declared, so it checks each of its outputs before sending it.
"""
from ._utils import PipeliningShapeError, TensorMeta

__all__ = ["handshake"]

_COMMON = ("schedule", "num_stages", "n_microbatches", "ranks")


def _about(schedule, stage, side):
    declared = stage.declared_outputs if side == "outputs" else stage.declared_inputs
    return {"stage": stage.stage_index, "schedule": type(schedule).__name__,
            "num_stages": stage.num_stages, "n_microbatches": schedule._n_microbatches,
            "ranks": stage.group_size,
            "declared": None if declared is None else [m.to_data() for m in declared]}


def _shapes(metas):
    return ", ".join(f"{tuple(m.shape)} {m.dtype}" for m in metas)


def _check(before, after, where):
    """``before``: what stage s-1 said (its outputs), ``after``: stage s (its inputs)."""
    for key in _COMMON:
        if before[key] != after[key]:
            raise RuntimeError(
                f"the ranks disagree on the pipeline: stage {before['stage']} ({where[0]}) has "
                f"{key}={before[key]!r}, stage {after['stage']} ({where[1]}) has "
                f"{key}={after[key]!r}")
    outs = [TensorMeta.from_data(m) for m in before["declared"] or ()]
    ins = [TensorMeta.from_data(m) for m in after["declared"] or ()]
    if before["declared"] is not None and after["declared"] is not None and outs != ins:
        raise PipeliningShapeError(
            f"shape mismatch between stages: stage {before['stage']} ({where[0]}) declares "
            f"outputs [{_shapes(outs)}] (output_args) but stage {after['stage']} ({where[1]}) "
            f"declares inputs [{_shapes(ins)}] (input_args)")
    return None if after["declared"] is None else tuple(ins)


def handshake(schedule):
    """Introduce this rank's stages to their neighbours (see the module docstring)."""
    stages = {st.stage_index: st for st in schedule._stages}
    rank_of = schedule.stage_index_to_group_rank
    channel = schedule._stages[0].channel
    me = schedule.rank
    posted, local = {}, []
    for s, st in stages.items():
        if not st.is_first and rank_of[s - 1] != me:
            key = ("hello", s, 0)  # from stage s-1, about its outputs
            posted[key] = (channel.post(key, rank_of[s - 1]), rank_of[s - 1])
        if not st.is_last and rank_of[s + 1] != me:
            key = ("hello", s + 1, 1)  # from stage s+1, about its inputs
            posted[key] = (channel.post(key, rank_of[s + 1]), rank_of[s + 1])
        if not st.is_last and s + 1 in stages:
            local.append(s)
    for s, st in stages.items():
        if not st.is_first and rank_of[s - 1] != me:
            channel.send(("hello", s, 1), rank_of[s - 1], _about(schedule, st, "inputs"))
        if not st.is_last and rank_of[s + 1] != me:
            channel.send(("hello", s + 1, 0), rank_of[s + 1], _about(schedule, st, "outputs"))
    for s in local:  # a boundary within this rank (V schedules)
        nxt = stages[s + 1]
        stages[s].next_declared_inputs = _check(
            _about(schedule, stages[s], "outputs"), _about(schedule, nxt, "inputs"),
            (f"rank {me}", f"rank {me}"))
    for (kind, s, side), (handle, peer) in posted.items():
        theirs = channel.take(handle, (kind, s, side), peer)
        if not (isinstance(theirs, dict) and set(_COMMON) | {"stage", "declared"} <=
                set(theirs)):
            raise RuntimeError(f"rank {me}: a malformed first message from rank {peer} "
                               f"(stage {s - 1 + side}): {str(theirs)[:80]}")
        if side == 0:  # stage s-1 told stage s (here) about its outputs
            _check(theirs, _about(schedule, stages[s], "inputs"), (f"rank {peer}", f"rank {me}"))
        else:  # stage s told stage s-1 (here) about its inputs
            stages[s - 1].next_declared_inputs = _check(
                _about(schedule, stages[s - 1], "outputs"), theirs,
                (f"rank {me}", f"rank {peer}"))
