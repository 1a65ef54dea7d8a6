"""RemoteModule, DistributedOptimizer and hooks that cross processes."""
import numpy as np
import pytest

import distgrad
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.distributed.autograd import hooks as dh
from distgrad.distributed.nn import RemoteModule
from distgrad.distributed.optim import DistributedOptimizer
from support import contexts
from support import dist_funcs as f

pytestmark = pytest.mark.timeout(60)

S1 = [(4, 5), (5,), (5, 5), (5,)]


def _x(seed=0, shape=(3, 4), dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _copy_into(module, values):
    with distgrad.no_grad():
        for p, v in zip(module.parameters(), values):
            p.copy_(distgrad.tensor(np.asarray(v)))


def _close(a, b, rtol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-9)


def test_remote_module_and_distributed_optimizer_train_like_one_process(rpc_world):
    rpc_world(2)
    rm = RemoteModule("worker1/cpu", distgrad.nn.Linear, args=(4, 5))
    head = distgrad.nn.Linear(5, 3)
    params = rm.remote_parameters() + [rpc.RRef(p) for p in head.parameters()]
    opt = DistributedOptimizer(distgrad.optim.SGD, params, lr=0.1, momentum=0.9)
    ref1, ref2 = distgrad.nn.Linear(4, 5), distgrad.nn.Linear(5, 3)
    _copy_into(ref1, [r.to_here().detach().numpy() for r in rm.remote_parameters()])
    _copy_into(ref2, [p.detach().numpy() for p in head.parameters()])
    ref_opt = distgrad.optim.SGD(list(ref1.parameters()) + list(ref2.parameters()), lr=0.1,
                                 momentum=0.9)
    for step in range(3):
        x = distgrad.tensor(_x(step))
        with dist_autograd.context() as cid:
            loss = (head(distgrad.tanh(rm(x))) ** 2).sum()
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        ref_opt.zero_grad()
        (ref2(distgrad.tanh(ref1(x))) ** 2).sum().backward()
        ref_opt.step()
        assert all(p.grad is None for p in head.parameters())
    for r, p in zip(rm.remote_parameters(), ref1.parameters()):
        _close(r.to_here().detach().numpy(), p.detach().numpy())
    for p, q in zip(head.parameters(), ref2.parameters()):
        _close(p.detach().numpy(), q.detach().numpy())


def test_tensor_and_node_hooks_across_processes_order_and_replacement(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", f.make_params, ("h1", 1, S1))
    f.make_params("h1@local", 1, S1)
    x = distgrad.tensor(_x(1, dtype=np.float64))
    rref = rpc.remote("worker1", f.stage_rref_tensor, ("h1", x))
    calls = []

    def tensor_cb(g):
        calls.append(("tensor", tuple(g.shape)))
        return g * 3.0

    def node_pre_cb(grad_outputs):
        calls.append("node_pre")

    def node_cb(grad_inputs, grad_outputs):
        calls.append("node")
    handles = [dh.register_tensor_hook(rref, tensor_cb),
               dh.register_tensor_hook(rref, "support.dist_funcs:times_ten"),
               dh.register_node_hook(rref, node_cb),
               dh.register_node_prehook(rref, node_cb and node_pre_cb),
               dh.register_node_prehook(rref, dh.by_reference(f.node_pre_log)),
               dh.register_node_hook(rref, dh.by_reference(f.node_post_log))]
    dh.retain_grad(rref)
    with dist_autograd.context() as cid:
        y = rref.to_here()
        dist_autograd.backward(cid, [(y * y).sum()], retain_graph=True)
        got = rpc.rpc_sync("worker1", f.grads_of, (cid, "h1"))
    assert calls == [("tensor", (3, 5)), "node_pre", "node"]
    assert rpc.rpc_sync("worker1", f.log) == ["tensor_ref", "node_pre_ref", "node_post_ref"]
    ps = f.params("h1@local")
    out = f.stage("h1@local", x)
    out.register_hook(lambda g: g * 30.0)
    out.retain_grad()
    (out * out).sum().backward()
    _close(dh.remote_grad(rref).numpy(), out.grad.numpy())  # retain_grad sees the hooked grad
    for g, p in zip(got, ps):
        _close(g, p.grad.numpy())
    for h in handles:
        h.remove()
    calls.clear()
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [rref.to_here().sum()])
    assert calls == [] and rpc.rpc_sync("worker1", f.log) == []


def test_module_hooks_both_ways_and_global_gradient_flow(rpc_world):
    rpc_world(2)
    rm1 = RemoteModule("worker1", distgrad.nn.Linear, args=(4, 5))
    rm2 = RemoteModule("worker2", distgrad.nn.Linear, args=(5, 3))
    seen = []

    def bwd_pre(module, grad_output):
        seen.append(("pre", module))
        return (grad_output[0] * 2.0,)

    def bwd(module, grad_input, grad_output):
        seen.append(("bwd", module, tuple(grad_output[0].shape)))

    def fwd_pre(module, args):
        seen.append(("fwd_pre", module))
    h = [rm1.register_forward_pre_hook(fwd_pre),
         rm1.register_forward_hook(dh.by_reference(f.module_fwd_scale)),
         rm1.register_full_backward_pre_hook(bwd_pre),
         rm1.register_full_backward_hook(bwd),
         rm2.register_forward_pre_hook(dh.by_reference(f.module_fwd_pre_log)),
         rm2.register_full_backward_pre_hook(dh.by_reference(f.module_bwd_pre_log)),
         rm2.register_full_backward_hook("support.dist_funcs:module_bwd_log")]
    ref = distgrad.nn.Linear(4, 5)
    _copy_into(ref, [r.to_here().detach().numpy() for r in rm1.remote_parameters()])
    x = distgrad.tensor(_x(2))
    with dist_autograd.context() as cid:
        y = rm1(x)
        assert seen == [("fwd_pre", "worker1:Linear")]
        dist_autograd.backward(cid, [rm2(y).sum()])
        g1 = rpc.rpc_sync("worker1", f.grads_of_module, (rm1.get_module_rref(), cid))
    assert seen[1:] == [("pre", "worker1:Linear"), ("bwd", "worker1:Linear", (3, 5))]
    assert rpc.rpc_sync("worker2", f.log) == [("module_fwd_pre_ref", "Linear"),
                                              ("module_bwd_pre_ref", "Linear"),
                                              ("module_bwd_ref", "Linear")]
    assert rpc.rpc_sync("worker1", f.log) == [("module_fwd_ref", "Linear")]
    # reference: forward output doubled by the forward hook, grad_output doubled by the pre-hook
    w2 = rm2.remote_parameters()[0].to_here().detach().numpy()
    ref_out = ref(x) * 2.0
    ref_out.register_hook(lambda g: g * 2.0)
    (ref_out @ distgrad.tensor(w2.T)).sum().backward()
    _close(g1[0], ref.weight.grad.numpy())
    for x_ in h:
        x_.remove()

    # one callback sees the gradient flow of every layer on every worker
    flow = []
    gh = dh.register_global_module_hook(
        "full_backward", lambda m, gin, gout: flow.append((m, float((gout[0] ** 2).sum()))))
    head = distgrad.nn.Linear(3, 1)
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [head(rm2(rm1(x))).sum()])
    assert [m for m, _ in flow] == ["worker0:Linear", "worker2:Linear", "worker1:Linear"]
    assert all(n > 0 for _, n in flow)
    gh.remove()
    flow.clear()
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [head(rm2(rm1(x))).sum()])
    assert flow == []


def test_saved_tensor_hooks_by_reference_per_context_and_hook_errors(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", f.make_params, ("sv", 3, S1))
    f.log()
    with dist_autograd.context() as cid:
        dh.register_saved_tensors_hooks(cid, f.pack_log, f.unpack_log, workers=["worker1"])
        y = rpc.rpc_sync("worker1", f.stage, ("sv", distgrad.tensor(_x(3, dtype=np.float64))))
        packed = rpc.rpc_sync("worker1", f.log)
        assert packed and set(packed) == {"pack"}
        dist_autograd.backward(cid, [y.sum()])
        assert rpc.rpc_sync("worker1", f.log) == ["unpack"] * len(packed)
    with dist_autograd.context() as cid:  # another context: no hooks
        y = rpc.rpc_sync("worker1", f.stage, ("sv", distgrad.tensor(_x(3, dtype=np.float64))))
        dist_autograd.backward(cid, [y.sum()])
        assert rpc.rpc_sync("worker1", f.log) == []

    rref = rpc.remote("worker1", f.stage_rref_tensor, ("sv", distgrad.tensor(_x(4, dtype=np.float64))))
    with dh.register_tensor_hook(rref, "support.dist_funcs:raise_in_hook"):
        with dist_autograd.context() as cid:
            # PyTorch's "Error on Node <rank>", naming the worker and the hook's class
            with pytest.raises(RuntimeError,
                               match=r"(?s)Error on Node 1: .*hook failed on purpose.*worker1"
                                     r".*KeyError"):
                dist_autograd.backward(cid, [rref.to_here().sum()])

    def bad(g):
        raise ValueError("callback refused")
    with dh.register_tensor_hook(rref, bad):
        with dist_autograd.context() as cid:
            with pytest.raises(ValueError, match=r"(?s)worker1.*callback refused"):
                dist_autograd.backward(cid, [rref.to_here().sum()])
    assert all(v == [] for v in contexts.live_everywhere().values())
