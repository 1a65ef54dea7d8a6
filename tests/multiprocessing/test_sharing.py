"""Shared memory: ``Tensor.share_memory_``/``is_shared``, ``Module.share_memory`` and tensors
crossing ``distgrad.multiprocessing`` as one buffer, checked against PyTorch where it runs."""
import json
import os
import subprocess
import sys
import textwrap
import warnings
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest

import distgrad
import distgrad.multiprocessing as mp
from distgrad import nn
from distgrad.utils.processes import reap

sys.path.insert(0, os.path.dirname(__file__))  # the children import sharing_targets by name
import sharing_targets  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _mapped_segments():
    """The shared segments this process maps, by inode (Linux: the memfd mappings)."""
    with open("/proc/self/maps") as fh:
        return {line.split()[4] for line in fh if "distgrad-shared" in line}


def test_share_memory_moves_the_data_in_place_and_keeps_values_layout_and_flags():
    t = distgrad.arange(12.0).reshape(3, 4).t()       # a transposed view: strides kept
    assert not t.is_shared()
    assert t.share_memory_() is t and t.is_shared()
    assert t.tolist() == np.arange(12.0).reshape(3, 4).T.tolist()
    assert t.stride() == (1, 4) and t.dtype == distgrad.float32
    first = t._data
    t.share_memory_()                                   # already shared: nothing moves
    assert t._data is first
    empty = distgrad.zeros(0, 3).share_memory_()
    assert empty.is_shared() and empty.shape == (0, 3)
    leaf = distgrad.ones(2, requires_grad=True).share_memory_()
    assert leaf.requires_grad and leaf.is_leaf
    (leaf * 2).sum().backward()
    assert leaf.grad.tolist() == [2.0, 2.0]


def test_tensors_sharing_the_bytes_move_together_numpy_arrays_do_not_as_in_torch():
    torch = pytest.importorskip("torch")
    outcomes = {}
    for lib in (distgrad, torch):
        base = lib.zeros(4, 3)
        view, alias = base[1:], base.detach()
        array = np.zeros(3, dtype=np.float32)
        from_np = lib.from_numpy(array)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            base.share_memory_()
            from_np.share_memory_()
        with lib.no_grad():
            alias.add_(1.0)
            from_np.add_(1.0)
        outcomes[lib.__name__] = [base.sum().item(), view.sum().item(), view.is_shared(),
                                  alias.is_shared(), array.tolist(), from_np.tolist()]
        if lib is distgrad:  # the detached NumPy array is said out loud here
            assert any("NumPy arrays from from_numpy()" in str(w.message) for w in caught)
    assert outcomes["distgrad"] == outcomes["torch"] == [
        12.0, 9.0, True, True, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_module_share_memory_shares_parameters_gradients_and_buffers_once():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    model[2].weight = nn.Parameter(model[2].weight.detach().clone())
    model(distgrad.randn(5, 3)).sum().backward()
    tied = nn.Linear(3, 3, bias=False)
    tied.weight = model[2].weight                       # one Parameter in two places
    both = nn.ModuleList([model, tied])
    assert both.share_memory() is both
    tensors = list(both.parameters()) + list(both.buffers()) + \
        [p.grad for p in both.parameters()]
    assert all(t.is_shared() for t in tensors)
    assert tied.weight is model[2].weight


def test_a_tensor_that_is_not_one_dense_array_refuses():
    class Sparse(distgrad.Tensor):
        is_sparse = True
    fake = distgrad.autograd.tensor._make(np.zeros(2, np.float32), cls=Sparse)
    with pytest.raises(RuntimeError, match="cannot be moved into shared memory"):
        fake.share_memory_()
    with pytest.raises(RuntimeError, match="cannot be moved"):
        ForkingPickler.dumps(fake)


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "RMSprop",
                                       "Adamax", "NAdam", "RAdam"])
def test_every_optimizer_updates_shared_parameters_in_place(optimizer):
    """An optimizer that replaced a parameter's array would train a private copy."""
    model = nn.Linear(3, 2).share_memory()
    views = [p.detach() for p in model.parameters()]     # other holders of the same bytes
    opt = getattr(distgrad.optim, optimizer)(model.parameters(), lr=0.1)
    before = [v.clone() for v in views]
    for _ in range(2):
        opt.zero_grad()
        model(distgrad.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    for p, v, b in zip(model.parameters(), views, before):
        assert p.is_shared() and p._data is not None
        assert distgrad.equal(p.detach(), v) and not distgrad.equal(v, b)


def test_non_leaf_that_requires_grad_refuses_to_travel_with_torchs_message():
    x = distgrad.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(x)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as theirs:
        ForkingPickler.dumps(torch.ones(2, requires_grad=True) * 2)
    with pytest.raises(RuntimeError) as ours:
        ForkingPickler.dumps(x)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_update_the_parents_buffers(method):
    ctx = mp.get_context(method)
    model = nn.Linear(2, 2).share_memory()
    loose = distgrad.ones(3)                  # not shared yet: sending it shares it, as torch
    before = [p.detach().clone() for p in model.parameters()]
    done = [ctx.Event() for _ in range(2)]
    lock = ctx.Lock()  # both children add 1: one at a time, so no update is lost
    children = [ctx.Process(target=sharing_targets.add_one,
                            args=(list(model.parameters()) + [loose], d, lock)) for d in done]
    try:
        for c in children:
            c.start()
        for c, d in zip(children, done):
            assert d.wait(60)
            c.join(60)
            assert c.exitcode == 0
    finally:
        reap(children, 5)
    assert loose.is_shared() and loose.tolist() == [3.0, 3.0, 3.0]
    for p, b in zip(model.parameters(), before):
        assert np.allclose(p.detach().numpy(), b.numpy() + 2.0)


def test_views_sent_separately_stay_one_buffer_in_the_child():
    ctx = mp.get_context("spawn")
    whole = distgrad.zeros(4)
    replies = ctx.Queue()
    child = ctx.Process(target=sharing_targets.write_through_view,
                        args=(whole, whole[2:], replies))
    try:
        child.start()
        seen_by_child = replies.get(timeout=60)
        child.join(60)
    finally:
        reap([child], 5)
    assert seen_by_child == [[0.0, 0.0, 7.0, 7.0], True, True]
    assert whole.tolist() == [0.0, 0.0, 7.0, 7.0]


def test_a_tensor_made_in_a_child_arrives_shared_through_a_queue():
    ctx = mp.get_context("spawn")
    queue, release = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=sharing_targets.send_new_tensor, args=(queue, release))
    try:
        child.start()
        t = queue.get(timeout=60)
        assert t.is_shared() and t.tolist() == [0.0, 1.0, 2.0, 3.0]
        t.mul_(10)
        release.set()
        assert queue.get(timeout=60) == [0.0, 10.0, 20.0, 30.0]
        child.join(60)
    finally:
        reap([child], 5)


def test_memory_is_released_with_the_last_user_also_after_a_crash():
    """No name in /dev/shm at any time, and the mapping goes with its last tensor, whether
    the child that also mapped it exited or was killed."""
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    mapped_before = _mapped_segments()
    ctx = mp.get_context("spawn")
    model = nn.Linear(64, 64).share_memory()
    done = ctx.Event()
    child = ctx.Process(target=sharing_targets.update_then_die, args=(model, done))
    try:
        child.start()
        assert done.wait(60)
        child.join(60)
    finally:
        reap([child], 5)
    assert child.exitcode == -9
    assert all(float(p.abs().sum()) == 0.0 for p in model.parameters())
    assert len(_mapped_segments() - mapped_before) >= 1
    if os.path.isdir("/dev/shm"):
        assert {n for n in set(os.listdir("/dev/shm")) - shm_before if "distgrad" in n} == set()
    del model, child
    import gc
    gc.collect()
    assert _mapped_segments() - mapped_before == set()


_FORK_PROGRAM = textwrap.dedent("""
    import json, multiprocessing
    import distgrad
    from distgrad import nn
    import sharing_targets

    ctx = multiprocessing.get_context("fork")
    distgrad.manual_seed(0)
    xs = distgrad.randn(64, 3)
    ys = xs @ distgrad.tensor([[1.0], [-2.0], [0.5]]) + 0.25
    shared, private = nn.Linear(3, 1).share_memory(), nn.Linear(3, 1)
    results = {}
    for name, model in (("shared", shared), ("private", private)):
        before = [p.tolist() for p in model.parameters()]
        procs = [ctx.Process(target=sharing_targets.hogwild_sgd, args=(r, model, 40, xs, ys))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        loss = distgrad.nn.functional.mse_loss(model(xs), ys).item()
        results[name] = [before == [p.tolist() for p in model.parameters()], loss]
    print(json.dumps(results))
""")


def test_fork_children_train_the_shared_model_and_copies_of_the_rest_as_torch():
    """A fresh interpreter forks (this test process may hold threads): parameters shared
    before the fork are trained by the children; the unshared model stays as it was."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(__file__)]))
    done = subprocess.run([sys.executable, "-c", _FORK_PROGRAM], env=env, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    assert results["shared"][0] is False and results["shared"][1] < 1e-3
    assert results["private"][0] is True and results["private"][1] > 0.1
