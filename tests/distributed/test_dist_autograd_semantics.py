"""What distributed autograd promises, behaviour by behaviour, without PyTorch.

PyTorch's own tests of these behaviours (its ``dist_autograd_test.py``) run against
distgrad in ``test_torch_dist_autograd.py`` where PyTorch is installed; these are ours,
so the behaviours stay checked where it is not. Each test names the PyTorch cases whose
behaviour it covers. Gradients are compared with the same graph run in one process.
"""
import threading

import numpy as np
import pytest

import distgrad
from distgrad.autograd import Function
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc

pytestmark = pytest.mark.timeout(60)

# A tensor each process holds on its own (its workers import this module too)
_HELD = distgrad.full((2, 3), 1.5, requires_grad=True)


# ------------------------------------------------------------------ run on the workers
def add(a, b):
    return a + b


def scaled_sum(a, b):
    """A user function with more than one op."""
    return (a * 2.0 + b.tanh() * a).sum(0, keepdim=True) + a


def forward_to(dst, a, b):
    """One more hop: ``dst`` computes, this worker adds its own op on the way back."""
    return rpc.rpc_sync(dst, scaled_sum, (a, b)) * 3.0


def held():
    return _HELD


def held_gradient(context_id):
    return dist_autograd.get_gradients(context_id).get(_HELD)


def gradients_of(context_id, tensors):
    """This process's gradients in ``context_id`` of the RRefs it owns, in order."""
    grads = dist_autograd.get_gradients(context_id)
    return [grads.get(r.local_value()) for r in tensors]


def rref_add(rref, t):
    return rref.local_value() + t


def rref_add_on(owner, rref, t):
    return rpc.rpc_sync(owner, rref_add, (rref, t))


def first_only(a, b):
    return a * 2.0


def three_rows(t):
    return t.split(1)


def raises(x):
    raise ValueError("the user function failed")


class _FailsInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        raise ValueError("backward failed on purpose")


def fails_in_backward(x):
    return _FailsInBackward.apply(x)


def bag(weight, indices, offsets):
    return distgrad.nn.functional.embedding_bag(indices, weight, offsets, mode="sum",
                                                sparse=True)


def train_on(ps, w_rref, x):
    """A trainer's step against a parameter server ``ps``: the gradient it leaves there."""
    with dist_autograd.context() as cid:
        loss = rpc.rpc_sync(ps, rref_add, (w_rref, x)).pow(2).sum()
        dist_autograd.backward(cid, [loss])
        return rpc.rpc_sync(ps, gradients_of, (cid, [w_rref]))[0]


# ------------------------------------------------------------------ helpers here
@pytest.fixture
def world(rpc_world):
    return rpc_world(3, scope="module")


def _t(seed, shape=(2, 3), dtype=np.float32, requires_grad=True):
    return distgrad.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype),
                           requires_grad=requires_grad)


def _local_grads(fn, *inputs):
    copies = [distgrad.tensor(x.detach().numpy(), requires_grad=x.requires_grad)
              for x in inputs]
    fn(*copies).backward()
    return [c.grad for c in copies]


def _same(got, want):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ tests
def test_contexts_are_per_thread_and_not_nested(world):
    """test_nested_context, test_thread_local_context_id, test_backward_without_context"""
    ids = {}
    with dist_autograd.context() as cid:
        with pytest.raises(RuntimeError, match="[Aa]lready have an autograd context"):
            with dist_autograd.context():
                pass

        def other():
            with dist_autograd.context() as theirs:
                ids["thread"] = theirs
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(30)
    assert ids["thread"] != cid
    with pytest.raises(RuntimeError, match="Could not find autograd context with id"):
        dist_autograd.backward(cid, [_t(0).sum()])
    with pytest.raises(RuntimeError, match="Could not find autograd context with id"):
        dist_autograd.get_gradients(cid)


def test_an_error_inside_a_context_leaves_it_released(world):
    """test_error_in_context, test_backward_python_udf_error"""
    with pytest.raises(ValueError, match="the user function failed"):
        with dist_autograd.context():
            rpc.rpc_sync("worker1", raises, (_t(0),))
    with dist_autograd.context() as cid:  # a new context is free to start
        dist_autograd.backward(cid, [(_t(1) * 2).sum()])


def test_bad_arguments_are_refused(world):
    """test_backward_invalid_args"""
    with dist_autograd.context() as cid:
        with pytest.raises(TypeError):
            dist_autograd.backward(None, [_t(0).sum()])
        with pytest.raises(RuntimeError):
            dist_autograd.backward(cid, [_t(0, requires_grad=False).sum()])
        with pytest.raises(RuntimeError, match="scalar"):
            dist_autograd.backward(cid, [_t(0) * 2])


@pytest.mark.parametrize("dst", ["worker1", "worker0"], ids=["other", "self"])
@pytest.mark.parametrize("call", ["rpc_sync", "rpc_async", "remote"])
@pytest.mark.parametrize("fn", [distgrad.add, add, scaled_sum], ids=["builtin", "udf", "udf2"])
def test_gradients_equal_those_of_one_process(world, dst, call, fn):
    """test_backward_simple(_self), _rref, _simple_python_udf, _complex_python_udf,
    test_async_dist_autograd, test_backward_no_grad_on_tensor"""
    a, b = _t(1), _t(2)
    with dist_autograd.context() as cid:
        if call == "rpc_sync":
            out = rpc.rpc_sync(dst, fn, (a, b))
        elif call == "rpc_async":
            out = rpc.rpc_async(dst, fn, (a, b)).wait()
        else:
            out = rpc.remote(dst, fn, (a, b)).to_here()
        dist_autograd.backward(cid, [out.sum()])
        grads = dist_autograd.get_gradients(cid)
        want = _local_grads(lambda x, y: fn(x, y).sum(), a, b)
        _same(grads[a], want[0])
        _same(grads[b], want[1])
    assert a.grad is None and b.grad is None  # never in .grad


@pytest.mark.parametrize("shape,dtype", [((3, 3), np.float32), ((2, 4, 5), np.float64)])
def test_shapes_dtypes_and_round_trips(world, shape, dtype):
    """test_backward_different_tensor_dims, _different_dtypes, _multiple_round_trips,
    test_backwards_nested_python_udf"""
    a, b = _t(3, shape, dtype), _t(4, shape, dtype)
    with dist_autograd.context() as cid:
        h = rpc.rpc_sync("worker1", forward_to, ("worker2", a, b))  # 0 -> 1 -> 2 -> 1 -> 0
        out = rpc.rpc_sync("worker2", add, (h, a)) * b                  # and back again
        dist_autograd.backward(cid, [out.sum()])
        grads = dist_autograd.get_gradients(cid)
        want = _local_grads(lambda x, y: ((scaled_sum(x, y) * 3.0 + x) * y).sum(), a, b)
        assert grads[a].dtype == a.dtype
        _same(grads[a], want[0])
        _same(grads[b], want[1])


def test_gradient_of_a_tensor_the_callee_holds_stays_there(world):
    """test_grad_only_on_return_value(_remote)"""
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", held)
        dist_autograd.backward(cid, [(out * 2).sum()])
        assert dist_autograd.get_gradients(cid) == {}
        g = rpc.rpc_sync("worker1", held_gradient, (cid,))
    np.testing.assert_array_equal(g.numpy(), np.full((2, 3), 2.0))


def test_rrefs_passed_on_get_their_gradient_on_their_owner(world):
    """test_backward_rref, _rref_multi, _rref_nested, test_trainer_ps"""
    owned = rpc.remote("worker1", distgrad.ones, ((2, 3),), {"requires_grad": True})
    t = _t(5)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", rref_add, (owned, t)) * 2 \
            + rpc.rpc_sync("worker2", rref_add_on, ("worker1", owned, t))
        dist_autograd.backward(cid, [out.sum()])
        (g_owned,) = rpc.rpc_sync("worker1", gradients_of, (cid, [owned]))
        np.testing.assert_array_equal(g_owned.numpy(), np.full((2, 3), 3.0))
        np.testing.assert_array_equal(dist_autograd.get_gradients(cid)[t].numpy(),
                                      np.full((2, 3), 3.0))
    w = distgrad.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    w_rref = rpc.RRef(w)  # this process is the parameter server
    grads = [rpc.rpc_async(f"worker{r}", train_on, ("worker0", w_rref, _t(r, requires_grad=False)))
             for r in (1, 2)]
    for r, fut in zip((1, 2), grads):
        want = _local_grads(lambda v: (v + _t(r, requires_grad=False)).pow(2).sum(), w)[0]
        _same(fut.wait(), want)
    assert w.grad is None


def test_what_the_loss_does_not_use_gets_no_gradient(world):
    """test_mixed_requires_grad, test_backward_unused_tensors,
    test_backward_multiple_output_tensors, test_backward_multiple_roots"""
    a, b, c = _t(6), _t(7, requires_grad=False), _t(8)
    with dist_autograd.context() as cid:
        x = rpc.rpc_sync("worker1", add, (a, b))
        y = rpc.rpc_sync("worker2", first_only, (a, c))
        r0, r1, _ = rpc.rpc_sync("worker1", three_rows, (_t(9, (3, 3)),))
        rows = _t(10, (3, 3))
        q0, _, q2 = rpc.rpc_sync("worker2", three_rows, (rows,))
        dist_autograd.backward(cid, [x.sum(), y.sum(), (q0 * 2).sum() + q2.sum(), r0.sum()])
        grads = dist_autograd.get_gradients(cid)
    assert b not in grads and c not in grads
    np.testing.assert_array_equal(grads[a].numpy(), np.full((2, 3), 3.0))
    np.testing.assert_array_equal(grads[rows].numpy(), [[2] * 3, [0] * 3, [1] * 3])


def test_errors_in_backward_reach_the_caller(world):
    """test_backward_autograd_engine_error, test_multiple_backward_with_errors"""
    a = _t(11)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", fails_in_backward, (a,)) + rpc.rpc_sync("worker2", add,
                                                                                (a, a))
        with pytest.raises(RuntimeError, match="backward failed on purpose"):
            dist_autograd.backward(cid, [out.sum()], retain_graph=True)
    with dist_autograd.context() as cid:  # the next pass works
        dist_autograd.backward(cid, [rpc.rpc_sync("worker2", add, (a, a)).sum()])


@pytest.mark.parametrize("nested", [False, True])
def test_backward_again_accumulates_in_the_context(world, nested):
    """test_backward_accumulate_grads, test_nested_backward_accumulate_grads,
    test_multiple_backward"""
    a, b = _t(12), _t(13)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", forward_to, ("worker2", a, b)) if nested \
            else rpc.rpc_sync("worker1", scaled_sum, (a, b))
        for _ in range(3):
            dist_autograd.backward(cid, [out.sum()], retain_graph=True)
        grads = dist_autograd.get_gradients(cid)
        fn = (lambda x, y: scaled_sum(x, y) * 3.0) if nested else scaled_sum
        want = _local_grads(lambda x, y: fn(x, y).sum() * 3, a, b)
        _same(grads[a], want[0])
        _same(grads[b], want[1])


def test_hooks_fire_once_per_pass(world):
    """test_backward_verify_hooks, test_post_hooks"""
    a = _t(14)
    a.register_hook(lambda g: g * 2)
    calls = []
    with dist_autograd.context() as cid:
        y = a * 1.0
        y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: calls.append(1))
        out = rpc.rpc_sync("worker1", add, (y, y))
        dist_autograd.backward(cid, [out.sum()])
        np.testing.assert_array_equal(dist_autograd.get_gradients(cid)[a].numpy(),
                                      np.full((2, 3), 4.0))
    assert calls == [1]


def test_a_gradient_nothing_else_holds_is_stored_without_a_copy(world):
    """test_no_grad_copy: a leaf's gradient that no other node holds becomes its gradient
    in the context as it is; one shared by two leaves, or not contiguous, is copied."""
    seen = {}

    class Pass(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            seen["ptr"] = g.data_ptr()
            return g

    class Both(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + y

        @staticmethod
        def backward(ctx, g):
            seen["ptr"] = g.data_ptr()
            return g, g

    a, b = _t(15, (5, 6)), _t(16, (5, 6))
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [Pass.apply(a)[1][0]])
        assert dist_autograd.get_gradients(cid)[a].data_ptr() == seen["ptr"]
    with dist_autograd.context() as cid:
        dist_autograd.backward(cid, [Both.apply(a, b).sum()])
        grads = dist_autograd.get_gradients(cid)
        assert seen["ptr"] not in (grads[a].data_ptr(), grads[b].data_ptr())


def test_sparse_gradients_stay_sparse(world):
    """test_*_sparse cases, test_no_grad_copy_sparse, test_grad_copy_sparse_indices_extra_ref,
    test_embedding_bag_with_no_grad_tensors"""
    s = distgrad.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.2, 4.1, 5.3], (3, 3),
                                   requires_grad=True)
    weight = _t(17, (6, 4))
    indices, offsets = distgrad.tensor([0, 2, 2, 5]), distgrad.tensor([0, 3])
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", add, (s, s))
        pooled = rpc.rpc_sync("worker2", bag, (weight, indices, offsets))
        dist_autograd.backward(cid, [distgrad.sparse.sum(out), pooled.sum()])
        grads = dist_autograd.get_gradients(cid)
        assert grads[s].is_sparse and grads[weight].is_sparse
        np.testing.assert_array_equal(grads[s].to_dense().numpy(),
                                      (s.detach().to_dense().numpy() != 0) * 2.0)
        np.testing.assert_array_equal(grads[weight].to_dense().numpy().sum(1),
                                      [4.0, 0, 8.0, 0, 0, 4.0])
