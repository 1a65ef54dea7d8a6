"""Stages and schedules within one process (a one-rank pipeline, every stage local: the
V schedules' direct hand-over between stages of a rank), the stage API PyTorch's
test_stage checks (caches, output chunks, a custom weight-gradient builder), the split
backward of zero-bubble schedules, and the errors of wrong use."""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.distributed.pipelining import PipelineStage
from distgrad.distributed.pipelining import schedules as S
from distgrad.distributed.pipelining._backward import (stage_backward, stage_backward_input,
                                                       stage_backward_weight)
from support import pipelining_cases as pc


class _Alone:
    rank, size = 0, 1


def _stages(full, n_stages, **kwargs):
    return [PipelineStage(full[k], k, n_stages, _channel=_Alone(), **kwargs)
            for k in range(n_stages)]


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS",
                                  "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
def test_a_one_rank_pipeline_trains_like_the_model(name):
    n_stages = 1 if name in pc.SINGLE else 2
    full = pc.model(n_stages)
    stages = _stages(full, n_stages)
    schedule = S.get_schedule_class(name)(stages[0] if name in pc.SINGLE else stages, 4,
                                          loss_fn=nn.MSELoss(reduction="sum"), scale_grads=False)
    x, y = pc.batch(16)
    losses = []
    out = schedule.step(x, target=y, losses=losses)
    ref = pc.reference(n_stages, 1, [(x, y)])
    assert out.grad_fn is None and len(losses) == 4
    np.testing.assert_allclose(out.numpy(), ref["out"], rtol=1e-6)
    for k, g in pc.grads_of(dict(full.named_children())).items():
        np.testing.assert_allclose(g, ref["grads"][k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_step_under_no_grad_and_a_missing_target_are_refused():
    full = pc.model(1)
    schedule = S.ScheduleGPipe(_stages(full, 1)[0], 2, loss_fn=nn.MSELoss())
    x, y = pc.batch(4)
    with distgrad.no_grad():
        with pytest.raises(RuntimeError, match="Please call eval"):
            schedule.step(x, target=y)
    with pytest.raises(RuntimeError, match="got no target"):
        schedule.step(x)
    with pytest.raises(TypeError, match="losses must be a list"):
        schedule._step_microbatches([(x,)] * 2, losses=())
    with pytest.raises(ValueError, match="Expecting 2 arg_mbs but got 3"):
        schedule._step_microbatches([(x,)] * 3)
    out = schedule.eval(x, target=y, losses=(losses := []))  # eval: losses, no backward
    assert len(losses) == 2 and full[0][0].weight.grad is None and out.shape == (4, 8)


def test_caches_are_emptied_and_only_the_last_stage_keeps_outputs():
    full = pc.model(2)
    stages = _stages(full, 2)
    schedule = S.ScheduleInterleaved1F1B(stages, 4, loss_fn=nn.MSELoss())
    x, y = pc.batch(16)
    schedule.step(x, target=y)
    assert all(len(s.fwd_cache) == 0 for s in stages)
    assert len(stages[0].output_chunks) == 0 and len(stages[1].output_chunks) == 4
    stages[1].clear_runtime_states()
    assert len(stages[1].output_chunks) == 0


def test_a_custom_weight_gradient_runner_runs_once_per_micro_batch():
    calls = []

    def builder():
        return lambda: calls.append(1)
    full = pc.model(1)
    stage = PipelineStage(full[0], 0, 1, _channel=_Alone(), dw_builder=builder)
    x, y = pc.batch(8)
    S.ScheduleGPipe(stage, 4, loss_fn=nn.MSELoss()).step(x, target=y)
    assert len(calls) == 4
    with pytest.raises(AssertionError, match="without first calling `backward_one_chunk"):
        stage.backward_weight_one_chunk(bwd_chunk_id=0)


def test_custom_functions_run_in_place_of_an_action_type():
    full = pc.model(2)
    schedule = S.ScheduleLoopedBFS(_stages(full, 2), 2, loss_fn=nn.MSELoss())
    seen = []
    schedule.register_custom_function(S.REDUCE_GRAD, lambda action, ctx: seen.append(
        (str(action), ctx.schedule_ref is schedule)))
    x, y = pc.batch(4)
    schedule.step(x, target=y)
    assert seen == [("1REDUCE_GRAD", True), ("0REDUCE_GRAD", True)]
    with pytest.raises(ValueError, match="Invalid computation type"):
        schedule.register_custom_function(S.SEND_F, lambda a, c: None)


def _two_layers():
    distgrad.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.LayerNorm(4))


def test_the_split_backward_adds_up_to_the_whole_bit_for_bit():
    model, x = _two_layers(), distgrad.randn(7, 6)
    g = distgrad.randn(7, 4)
    whole_in = x.detach().requires_grad_()
    (dx,) = stage_backward([model(whole_in)], [g], [whole_in])
    whole = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    split_in = x.detach().requires_grad_()
    (dx_split,), groups = stage_backward_input([model(split_in)], [g], [split_in],
                                               model.parameters())
    assert all(p.grad is None for p in model.parameters())  # nothing before W
    np.testing.assert_array_equal(dx_split.numpy(), dx.numpy())
    stage_backward_weight(model.parameters(), groups)
    for got, want in zip(model.parameters(), whole):
        np.testing.assert_array_equal(got.grad.numpy(), want)


def test_the_split_backward_of_a_loss():
    model, x, y = _two_layers(), distgrad.randn(7, 6), distgrad.randn(7, 4)
    inp = x.detach().requires_grad_()
    nn.MSELoss()(model(inp), y).backward()
    want = [p.grad.numpy().copy() for p in model.parameters()] + [inp.grad.numpy().copy()]
    model.zero_grad()
    inp = x.detach().requires_grad_()
    (dx,), groups = stage_backward_input(nn.MSELoss()(model(inp), y), None, [inp],
                                         model.parameters())
    stage_backward_weight(model.parameters(), groups)
    got = [p.grad.numpy() for p in model.parameters()] + [dx.numpy()]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_module_is_where_torch_programs_look_for_it():
    import importlib
    # a program that does `import distgrad as torch` finds it as an attribute
    assert distgrad.distributed.pipelining.PipelineStage is PipelineStage
    for name in ("schedules", "stage", "microbatch", "_backward", "_utils", "_IR"):
        importlib.import_module(f"distgrad.distributed.pipelining.{name}")
    from distgrad.distributed.pipelining._utils import PipeliningMetadataError, PipeliningShapeError
    assert issubclass(PipeliningShapeError, PipeliningMetadataError)
    assert issubclass(PipeliningMetadataError, RuntimeError)
