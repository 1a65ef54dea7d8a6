"""Schedule orders and their IR, in one process: every schedule's order is PyTorch's
(compute actions and the lowered order with its sends and receives), every order is
valid and runs without deadlock in the dry run, the IR parses, lowers and round-trips
through CSV as PyTorch's does, and schedules given the wrong stages say so."""
import itertools

import pytest

from distgrad import nn
from distgrad.distributed.pipelining import PipelineStage
from distgrad.distributed.pipelining._utils import generate_rank_to_stage_mapping
from distgrad.distributed.pipelining import schedules as S
from distgrad.distributed.pipelining.schedules import (B, F, I, RESHARD, UNSHARD, W, _Action,
                                                       _add_send_recv, _add_unshard_reshard,
                                                       _merge_bw, _simulate_comms_compute,
                                                       _validate_schedule, get_schedule_class)

MULTI = ["Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"]
SINGLE = ["GPipe", "1F1B"]


class _Ranks:
    """The channel of a stage that is never run here: only its place in the pipeline."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def _stage(index, n_stages, size, rank=0):
    return PipelineStage(nn.Linear(1, 1), index, n_stages, _channel=_Ranks(rank, size))


def _schedule(cls_name, pp, n_local, n_mb, rank=0, module=S, **kwargs):
    """``cls_name`` built for ``rank`` of ``pp`` (our classes, or PyTorch's with
    ``module`` and stand-in stages)."""
    cls = module.get_schedule_class(cls_name)
    style = "v" if cls_name in ("ZBVZeroBubble", "DualPipeV") else "loop"
    mine = generate_rank_to_stage_mapping(pp, pp * n_local, style)[rank]
    if module is S:
        stages = [_stage(s, pp * n_local, pp, rank) for s in mine]
    else:
        stages = [_TorchStage(s, pp * n_local, pp, rank) for s in mine]
    return cls(stages[0] if cls_name in SINGLE else stages, n_mb, **kwargs)


class _TorchStage:
    def __init__(self, index, n, size, rank):
        import torch
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, n, size, rank
        self.submod = torch.nn.Linear(1, 1)
        self.is_first, self.is_last = index == 0, index == n - 1


def _text(order):
    return {r: ["" if a is None else str(a) for a in v] for r, v in order.items()}


GRID = [(name, pp, n_local, n_mb)
        for name in SINGLE + MULTI for pp in (1, 2, 3, 4)
        for n_local in ((1,) if name in SINGLE else (2,) if name in ("ZBVZeroBubble",
                                                                      "DualPipeV") else (1, 2, 3))
        for n_mb in (1, 2, 3, 4, 6, 8, 12)]


def _built(name, pp, n_local, n_mb, module=S):
    try:
        return _schedule(name, pp, n_local, n_mb, module=module), None
    except (ValueError, AssertionError) as e:
        return None, e


@pytest.mark.timeout(120)
def test_every_order_is_pytorchs():
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for name, pp, n_local, n_mb in GRID:
        ours, our_error = _built(name, pp, n_local, n_mb)
        theirs, their_error = _built(name, pp, n_local, n_mb, torch_schedules)
        where = (name, pp, n_local, n_mb)
        assert type(our_error) is type(their_error), where
        if our_error is not None:
            assert str(our_error) == str(their_error), where
            continue
        if name != "1F1B":  # PyTorch's 1F1B order starts its last rank at F1 (a display bug)
            assert _text(ours.pipeline_order) == _text(theirs.pipeline_order), where
        if hasattr(theirs, "pipeline_order_with_comms"):
            assert _text(ours.pipeline_order_with_comms) == \
                _text(theirs.pipeline_order_with_comms), where


def test_deferred_receives_are_placed_as_pytorch_places_them():
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    for name, pp, n_mb in [("Interleaved1F1B", 2, 4), ("InterleavedZeroBubble", 4, 8),
                           ("DualPipeV", 2, 6), ("LoopedBFS", 3, 6)]:
        n_local = 2
        ours = _schedule(name, pp, n_local, n_mb, defer_pp_recv=True)
        theirs = _schedule(name, pp, n_local, n_mb, module=torch_schedules, defer_pp_recv=True)
        assert _text(ours.pipeline_order_with_comms) == \
            _text(theirs.pipeline_order_with_comms), name


def test_every_order_is_valid_and_runs_in_the_dry_run():
    for name, pp, n_local, n_mb in GRID:
        ours, error = _built(name, pp, n_local, n_mb)
        if error is not None:
            continue
        n_stages = pp * n_local
        mapping = _validate_schedule(ours.pipeline_order, pp, n_stages, n_mb)
        assert mapping == ours.stage_index_to_group_rank
        lowered = ours._lowered()
        _simulate_comms_compute(lowered, mapping.__getitem__, n_stages)
        for rank, actions in lowered.items():  # every stage: backwards in one order
            actions = [x for a in actions for x in (a.sub_actions or (a,))]
            for s in {a.stage_index for a in actions if a.is_compute_op}:
                mbs = [a.microbatch_index for a in actions
                       if a.stage_index == s and a.computation_type in (B, I)]
                step = -1 if name == "LoopedBFS" else 1
                assert mbs == list(range(n_mb))[::step], (name, pp, n_local, n_mb, s)


def test_the_1f1b_order_of_the_last_rank_starts_at_micro_batch_0():
    order = _schedule("1F1B", 2, 1, 3).pipeline_order
    assert [str(a) for a in order[1]] == ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2",
                                          "1REDUCE_GRAD"]


@pytest.mark.parametrize("text,action", [
    ("1F0", _Action(1, F, 0)), ("2B1", _Action(2, B, 1)), ("0W3", _Action(0, W, 3)),
    ("3I12", _Action(3, I, 12)), ("1UNSHARD", _Action(1, UNSHARD)),
    ("3RESHARD", _Action(3, RESHARD)), ("0SEND_F2", _Action(0, S.SEND_F, 2)),
    ("(0F2;1B1)OVERLAP_F_B", _Action(-1, S.OVERLAP_F_B, None,
                                     (_Action(0, F, 2), _Action(1, B, 1))))])
def test_actions_parse_and_print_back(text, action):
    assert _Action.from_str(text) == action and repr(action) == text
    assert _Action.from_str("  ") is None


def test_a_bad_action_string_is_named():
    with pytest.raises(RuntimeError, match="Invalid action string: 1X0"):
        _Action.from_str("1X0")


def _parse(items):
    return [_Action.from_str(s) for s in items]


def test_lowering_passes():
    assert _add_unshard_reshard(_parse(["0F0", "0F1", "   ", "0B0", "0B1"])) == \
        _parse(["0UNSHARD", "0F0", "0F1", "0B0", "0B1", "0RESHARD"])
    assert _merge_bw(_parse(["0F0", "0I0", "0W0", "0I1", "1W1"])) == \
        _parse(["0F0", "0B0", "0I1", "1W1"])
    lowered = _add_send_recv({0: _parse(["0F0", "0B0"]), 1: _parse(["1F0", "1B0"])},
                             lambda s: s, 2)
    assert _text(lowered) == {0: ["0F0", "0SEND_F0", "0RECV_B0", "0B0"],
                              1: ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]}


def test_a_schedule_that_breaks_the_rules_is_refused():
    with pytest.raises(AssertionError, match="Running Full Backward for stage 0, microbatch 0 "
                                             "without first running Forward"):
        _validate_schedule({0: _parse(["0B0", "0F0"])}, 1, 1, 1)
    with pytest.raises(AssertionError, match="Stage 0 is assigned to both rank 1 and rank 0"):
        _validate_schedule({0: _parse(["0F0", "0B0"]), 1: _parse(["0F0"])}, 2, 1, 1)
    with pytest.raises(AssertionError, match="I and W must have equal counts"):
        _validate_schedule({0: _parse(["0F0", "0I0"])}, 1, 1, 1)
    with pytest.raises(AssertionError, match="Got 1 F microbatches for stage 0, expected 2"):
        _validate_schedule({0: _parse(["0F0", "0B0"])}, 1, 1, 2)


@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
def test_orders_round_trip_through_csv(tmp_path, fmt):
    made = _schedule("InterleavedZeroBubble", 2, 2, 4)
    path = tmp_path / "order.csv"
    made._dump_csv(str(path), format=fmt)
    loaded = S._PipelineScheduleRuntime([_stage(0, 4, 2), _stage(2, 4, 2)], 4)
    loaded._load_csv(str(path), format=fmt)
    assert _text(loaded.pipeline_order_with_comms) == _text(made.pipeline_order_with_comms)
    text = "\n".join(",".join(map(str, made.pipeline_order[r])) for r in (0, 1))
    from_text = S._PipelineScheduleRuntime([_stage(0, 4, 2), _stage(2, 4, 2)], 4)
    from_text._load_actions(text.replace("None", ""))
    assert _text(from_text.pipeline_order_with_comms) == _text(made.pipeline_order_with_comms)


def test_schedule_names():
    assert get_schedule_class("zbvzerobubble") is S.ScheduleZBVZeroBubble
    assert get_schedule_class("GPIPE") is S.ScheduleGPipe
    with pytest.raises(ValueError, match="Unknown schedule name 'Bogus'. The valid options are"):
        get_schedule_class("Bogus")


def test_a_schedule_given_the_wrong_stages_says_so():
    with pytest.raises(ValueError, match="runs one stage per rank, but the pipeline has 4 stages"):
        S.ScheduleGPipe(_stage(0, 4, 2), 4)
    with pytest.raises(TypeError, match="takes a PipelineStage, not a list"):
        S.ScheduleGPipe([_stage(0, 2, 2)], 4)
    with pytest.raises(ValueError, match="2 ranks with 2 stages each make 4 stages, but the "
                                         "stages say num_stages=6"):
        S.ScheduleInterleaved1F1B([_stage(0, 6, 2), _stage(2, 6, 2)], 4)
    with pytest.raises(ValueError, match=r"places stages \[0, 2\] on rank 0, but this rank was "
                                         "given stage 1"):
        S.ScheduleLoopedBFS([_stage(0, 4, 2), _stage(1, 4, 2)], 4)
    with pytest.raises(ValueError, match="ZBV requires exactly 2 stages per rank, but got 3"):
        S.ScheduleZBVZeroBubble([_stage(i, 6, 2) for i in (0, 3, 5)], 4)
    with pytest.raises(ValueError, match=r"Number of microbatches \(2\) must be greater than or "
                                         r"equal to the number of stages \(3\)"):
        S.Schedule1F1B(_stage(0, 3, 3), 2)
    with pytest.raises(ValueError, match="Stage index 2 is out of range of 2"):
        _stage(2, 2, 2)
    with pytest.raises(RuntimeError, match="Pipeline group size 4 cannot be larger than number "
                                           "of stages 2"):
        _stage(0, 2, 4)


def test_the_dry_run_finds_a_deadlock():
    order = {0: _parse(["0RECV_B0", "0F0", "0SEND_F0", "0B0"]),  # waits for its own B's input
             1: _parse(["1RECV_F0", "1F0", "1B0", "1SEND_B0"])}
    with pytest.raises(ValueError, match="Schedule is not progressing"):
        _simulate_comms_compute(order, lambda s: s, 2)
    assert list(itertools.chain(*_simulate_comms_compute(
        _schedule("GPipe", 2, 1, 2)._lowered(), lambda s: s, 2).values()))
