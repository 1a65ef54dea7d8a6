"""Replies produced later on another thread keep their gradient; many threads at once mix
every kind of call with distributed backward and nothing is lost."""
import threading

import numpy as np
import pytest

import distgrad
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from support import contexts
from support import dist_funcs as f
from support import rpc_funcs as rf

pytestmark = pytest.mark.timeout(90)

S1 = [(4, 5), (5,), (5, 5), (5,)]


def _x(seed=0):
    return np.random.default_rng(seed).standard_normal((3, 4))


def _local_grads(key, loss_of):
    ps = f.params(key + "@local")
    for p in ps:
        p.grad = None
    x = distgrad.tensor(_x(), requires_grad=True)
    loss_of(x).backward()
    return x.grad.numpy(), [p.grad.numpy() for p in ps]


@pytest.mark.parametrize("how", ["timer", "nested_then"])
def test_async_execution_replies_keep_their_gradient(rpc_world, how):
    rpc_world(2)
    rpc.rpc_sync("worker1", f.make_params, ("a1", 1, S1))
    f.make_params("a1@local", 1, S1)
    x = distgrad.tensor(_x(), requires_grad=True)
    with dist_autograd.context() as cid:
        if how == "timer":
            y = rpc.rpc_sync("worker1", f.stage_later, ("a1", x, 0.2))
        else:
            y = rpc.rpc_async("worker1", f.stage_via, ("worker2", "a1", x)).wait(30)
        assert y.grad_fn is not None and y.grad_fn.name() == "RecvRpcBackward"
        loss = (y * y).sum()
        dist_autograd.backward(cid, [loss])
        gx = dist_autograd.get_gradients(cid)[x].numpy()
        gp = rpc.rpc_sync("worker1", f.grads_of, (cid, "a1"))

    def single(xl):
        h = f.stage("a1@local", xl)
        out = h if how == "timer" else f.mul_add(h, h) * 2.0 + h
        return (out * out).sum()
    want_x, want_p = _local_grads("a1", single)
    np.testing.assert_allclose(gx, want_x, rtol=1e-6, atol=1e-9)
    for g, w in zip(gp, want_p):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


def test_sixteen_threads_mix_every_kind_of_call(rpc_world):
    rpc_world(2)
    for w in ("worker1", "worker2"):
        rpc.rpc_sync(w, f.make_params, ("st", 3, S1))
    f.make_params("st@local", 3, S1)
    want_x, _ = _local_grads("st", lambda xl: f.stage("st@local", xl).sum())
    errors, done = [], []

    def work(i):
        try:
            w = "worker1" if i % 2 else "worker2"
            for j in range(6):
                kind = (i + j) % 4
                if kind == 0:
                    assert rpc.rpc_sync(w, rf.add, (i, j)) == i + j
                elif kind == 1:
                    assert rpc.rpc_async(w, rf.echo, ([i, (j,)],)).wait(30) == [i, (j,)]
                elif kind == 2:
                    r = rpc.remote(w, rf.Counter, (i,))
                    assert r.rpc_sync().increment(j) == i + j and r.rpc_sync().get() == i + j
                else:
                    x = distgrad.tensor(_x(), requires_grad=True)
                    with dist_autograd.context() as cid:
                        loss = rpc.rpc_sync(w, f.stage, ("st", x)).sum()
                        dist_autograd.backward(cid, [loss])
                        g = dist_autograd.get_gradients(cid)[x].numpy()
                    np.testing.assert_allclose(g, want_x, rtol=1e-6, atol=1e-9)
            done.append(i)
        except BaseException as e:  # noqa: BLE001 - reported below with the thread's number
            errors.append((i, e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert sorted(done) == list(range(16))
    assert contexts.live_everywhere() == {"worker0": [], "worker1": [], "worker2": []}
