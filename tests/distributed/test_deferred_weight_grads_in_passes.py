"""A part of a distributed backward leaves its linear weights' gradients for its end and
computes them there in one product per weight over every micro-batch of the pass: the
gradients read from the context are those of the plain backward, a hooked weight is not
deferred, a failed pass leaves nothing half-accumulated, and a second pass adds up."""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.autograd.deferred_weight_grads import WeightGradStore
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.rpc import current_agent
from support import deferral_funcs as f

pytestmark = pytest.mark.timeout(60)

SEED, D, LAYERS, MICRO, ROWS = 3, 16, 2, 4, 5


@pytest.fixture
def stage(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", f.run_nodes_on_handlers)
    return rpc.rpc_sync("worker1", f.make_stage, (SEED, D, LAYERS))


def _batches():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((ROWS, D)).astype(np.float32) for _ in range(MICRO)]


def _reference(times=1):
    """The same stage and micro-batches in this process (no deferral): its gradients."""
    distgrad.manual_seed(SEED)
    model = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(D, D), nn.Tanh())])
    for _ in range(times):
        sum(model(distgrad.tensor(x)).pow(2).sum() for x in _batches()).backward()
    return [p.grad.numpy() for p in model.parameters()]


def _pass(cid, forward=f.forward, retain_graph=False, times=1, inputs_grad=False):
    outs = [rpc.rpc_sync("worker1", forward, (distgrad.tensor(x, requires_grad=inputs_grad),))
            for x in _batches()]
    loss = sum(o.pow(2).sum() for o in outs)
    for _ in range(times):
        dist_autograd.backward(cid, [loss], retain_graph=retain_graph)


def _deferred():
    return rpc.rpc_sync("worker1", f.deferred_count)


def _grads_after_a_pass(**how):
    """The stage's gradients in a context after one ``_pass(cid, **how)``."""
    with dist_autograd.context() as cid:
        _pass(cid, **how)
        return rpc.rpc_sync("worker1", f.grads, (cid,))


def _assert_close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_the_gradients_are_the_plain_backwards_and_every_weight_was_deferred(stage):
    before = _deferred()
    _assert_close(_grads_after_a_pass(), _reference())
    assert _deferred() - before == LAYERS * MICRO  # one per weight and micro-batch


def test_a_hooked_weight_is_computed_as_the_pass_runs_and_the_others_deferred(stage):
    rpc.rpc_sync("worker1", f.hook_first_weight)
    before = _deferred()
    _assert_close(_grads_after_a_pass(), _reference())
    # as in PyTorch: one call per pass, with the sum of the micro-batches' gradients
    assert rpc.rpc_sync("worker1", f.hook_calls) == 1
    assert _deferred() - before == (LAYERS - 1) * MICRO


def test_a_second_pass_with_retain_graph_adds_up(stage):
    _assert_close(_grads_after_a_pass(retain_graph=True, times=2), _reference(times=2))


def test_a_failed_pass_accumulates_no_deferred_gradient(stage):
    before = _deferred()
    with dist_autograd.context() as cid:
        with pytest.raises(RuntimeError, match="failed on purpose"):
            _pass(cid, forward=f.forward_failing_after_the_layers, inputs_grad=True)
        got = rpc.rpc_sync("worker1", f.grads, (cid,))
    weights = got[0::2]
    assert all(g is None for g in weights), "a failed pass's deferred products were computed"
    assert _deferred() == before


def test_inputs_under_saved_tensor_hooks_are_not_kept_for_later(stage):
    """Offloaded inputs would come back and stay in memory until the part's end."""
    before = _deferred()
    _assert_close(_grads_after_a_pass(forward=f.forward_under_saved_tensor_hooks), _reference())
    assert _deferred() == before


def test_a_part_that_ships_nothing_and_uses_each_weight_once_defers_nothing(stage):
    """Deferring would buy it nothing (no process waits for its gradients, no product
    over several micro-batches): its products run as the nodes do, as in a local
    backward, bit for bit."""
    x = _batches()[0]
    before = _deferred()
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", f.forward, (distgrad.tensor(x),))
        dist_autograd.backward(cid, [out.pow(2).sum()])
        got = rpc.rpc_sync("worker1", f.grads, (cid,))
    assert _deferred() == before
    distgrad.manual_seed(SEED)
    model = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(D, D), nn.Tanh())])
    model(distgrad.tensor(x)).pow(2).sum().backward()
    for g, p in zip(got, model.parameters()):
        np.testing.assert_array_equal(g, p.grad.numpy())


def test_a_part_that_ships_its_input_gradient_defers_with_one_micro_batch(stage):
    before = _deferred()
    with dist_autograd.context() as cid:
        x = distgrad.tensor(_batches()[0], requires_grad=True)
        out = rpc.rpc_sync("worker1", f.forward, (x,))
        dist_autograd.backward(cid, [out.pow(2).sum()])
        assert dist_autograd.get_gradients(cid)[x] is not None
    assert _deferred() - before == LAYERS


def test_a_part_ending_on_the_io_thread_computes_a_large_deferral_on_a_handler(rpc_world):
    """The nodes ran where the gradient arrived; the end's products (4M multiply-adds, past
    the on-arrival bound) go to a handler, so the I/O thread goes on serving. (The input
    requires grad: the part ships its gradient, so it defers.)"""
    rpc_world(1)
    rpc.rpc_sync("worker1", f.run_nodes_where_they_arrive)
    d, rows = 1024, 4
    rpc.rpc_sync("worker1", f.make_stage, (SEED, d, 1))
    x = np.random.default_rng(1).standard_normal((rows, d)).astype(np.float32)
    runs_before, ends_before = rpc.rpc_sync("worker1", f.handed_off)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", f.forward, (distgrad.tensor(x, requires_grad=True),))
        dist_autograd.backward(cid, [out.pow(2).sum()])
        got = rpc.rpc_sync("worker1", f.grads, (cid,))
    runs, ends = rpc.rpc_sync("worker1", f.handed_off)
    assert (runs - runs_before, ends - ends_before) == (0, 1)
    distgrad.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(d, d), nn.Tanh())
    model(distgrad.tensor(x)).pow(2).sum().backward()
    for g, p in zip(got, model.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_coordinator_starts_the_part_it_held_back_before_its_own_weight_gradients(
        stage, monkeypatch):
    """The coordinator's last node ships the gradient that starts worker1's part; the
    coordinator computes its own deferred products while that part runs, not before."""
    agent = current_agent()
    sent_at_flush = []
    flush = WeightGradStore.flush

    def flush_and_record(store):
        sent_at_flush.append(agent.stats["messages_sent"])
        return flush(store)
    monkeypatch.setattr(WeightGradStore, "flush", flush_and_record)
    layer = nn.Linear(D, D)  # the coordinator's own stage, after worker1's
    with dist_autograd.context() as cid:
        h = rpc.rpc_sync("worker1", f.forward, (distgrad.tensor(_batches()[0]),))
        sent = agent.stats["messages_sent"]
        dist_autograd.backward(cid, [layer(h).pow(2).sum()])
        assert layer.weight in dist_autograd.get_gradients(cid)
    assert sent_at_flush == [sent + 1]  # worker1's start left first
