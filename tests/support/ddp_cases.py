"""What ranks 0 and 1 of a ``pg_world.World`` run for the DDP tests (in their group of two).

Each rank trains a small model under ``DistributedDataParallel`` on its shard of a batch
and checks it against the same model trained in this one process on the whole batch
(the reference), and, where torch is installed, against torch's DDP over gloo."""
import contextlib

import numpy as np

import distgrad
from distgrad import nn
from distgrad.distributed import ddp as ddp_impl
from distgrad.nn.parallel import DistributedDataParallel as DDP
from support import pg_world

CASES, case = pg_world.registry()
N = 2  # the ranks of the DDP group: the world's first two


def ddp(ctx, module, **kwargs):
    return DDP(module, process_group=ctx.groups[N], **kwargs)


def mlp(seed, width=16):
    """An MLP of 30 and 5000 floats of parameters: small and large buckets."""
    g = np.random.default_rng(seed)
    net = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 50), nn.Tanh(),
                        nn.Linear(50, 3))
    for p in net.parameters():
        p.data = distgrad.tensor(g.standard_normal(tuple(p.shape)).astype(np.float32) * 0.3)
    return net


def data(n_rows=12):
    g = np.random.default_rng(42)
    return (g.standard_normal((n_rows, 6)).astype(np.float32),
            g.standard_normal((n_rows, 3)).astype(np.float32))


@contextlib.contextmanager
def in_place_from(nbytes):
    """Parameters of ``nbytes`` and more reduced in their own gradient (``_Unit``): the
    small models here have none of the default's megabyte."""
    old = ddp_impl._IN_PLACE_BYTES
    if nbytes is not None:
        ddp_impl._IN_PLACE_BYTES = nbytes
    try:
        yield
    finally:
        ddp_impl._IN_PLACE_BYTES = old


def shard(a, rank, n):
    k = len(a) // n
    return a[rank * k:(rank + 1) * k]


def params(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


def reference(steps, micro, lr=0.05):
    """One process, the whole batch: the same updates DDP must make (the loss of a step is
    the mean over every rank's micro-batches of their mean losses)."""
    net = mlp(0)
    opt = distgrad.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    X, Y = data()
    for _ in range(steps):
        opt.zero_grad()
        parts = np.array_split(np.arange(len(X)), micro)
        loss = sum(((net(distgrad.tensor(X[i])) - distgrad.tensor(Y[i])) ** 2).mean()
                   for i in parts) / micro
        loss.backward()
        opt.step()
    return params(net)


@case
def train(ctx, config):
    """DDP with ``config`` (bucket_cap_mb, gradient_as_bucket_view, micro: micro-batches per
    step, all but the last under no_sync; in_place: the size from which a parameter is
    reduced in its own gradient; strided: rank 1's second weight has a non-contiguous
    .grad, which takes the bucket while rank 0 reduces in place) equals the one-process
    reference."""
    micro = config.get("micro", 1)
    with in_place_from(config.get("in_place")):
        model = ddp(ctx, mlp(ctx.rank), bucket_cap_mb=config.get("bucket_cap_mb"),
                    gradient_as_bucket_view=config.get("view", False))
    strided = config.get("strided") and ctx.rank == 1
    w2 = model.module[2].weight
    for p, q in zip(model.parameters(), mlp(0).parameters()):  # every rank starts from rank 0's
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    opt = distgrad.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    X, Y = data()
    steps = 3
    for _ in range(steps):
        opt.zero_grad(set_to_none=config.get("set_to_none", True))
        if strided:
            w2.grad = distgrad.zeros(tuple(w2.shape[::-1])).t()
            assert not w2.grad.is_contiguous()
        xs, ys = shard(X, ctx.rank, N), shard(Y, ctx.rank, N)
        parts = np.array_split(np.arange(len(xs)), micro)
        for j, i in enumerate(parts):
            if j < micro - 1:
                with model.no_sync():
                    loss = ((model(distgrad.tensor(xs[i])) - distgrad.tensor(ys[i])) ** 2).mean()
                    (loss / micro).backward()
            else:
                loss = ((model(distgrad.tensor(xs[i])) - distgrad.tensor(ys[i])) ** 2).mean()
                (loss / micro).backward()
        if config.get("view"):
            b = model._buckets
            assert all(any(p.grad._data is v for v in bk.views) for bk in b for p in bk.params)
        if config.get("in_place"):
            # the weights are units of their own, reduced in their .grad (w2: in rank 1's
            # bucket slot when strided)
            alone = {id(u.bucket.params[u.lo]): u for u in model._units if u.alone}
            assert len(alone) == 3 and id(w2) in alone
            assert all(u.target is not None for i, u in alone.items() if i != id(w2))
            assert (alone[id(w2)].target is None) == bool(strided)
        opt.step()
    got = params(model)
    want = reference(steps, micro * N)
    err = max(float(np.abs(a - b).max()) for a, b in zip(got, want))
    assert err < 1e-5, err
    return [err, float(sum(a.sum() for a in got)), len(model._buckets)]


@case
def against_torch(ctx):
    """distgrad's DDP and torch's DDP over gloo, same start, same data: same parameters."""
    import torch
    import torch.distributed as tdist
    if ctx.rank == 0:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ctx.store.set("torch_port", str(s.getsockname()[1]))
        s.close()
    port = int(ctx.store.get("torch_port"))
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                             world_size=N)
    try:
        torch.set_num_threads(1)
        ours = ddp(ctx, mlp(0), bucket_cap_mb=0.01)
        theirs_net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                         torch.nn.Linear(16, 50), torch.nn.Tanh(),
                                         torch.nn.Linear(50, 3))
        with torch.no_grad():
            for p, q in zip(theirs_net.parameters(), ours.parameters()):
                p.copy_(torch.from_numpy(q.detach().numpy()))
        theirs = torch.nn.parallel.DistributedDataParallel(theirs_net, bucket_cap_mb=0.01)
        o1 = distgrad.optim.Adam(ours.parameters(), lr=0.01)
        o2 = torch.optim.Adam(theirs.parameters(), lr=0.01)
        X, Y = data()
        xs, ys = shard(X, ctx.rank, N), shard(Y, ctx.rank, N)
        for _ in range(4):
            o1.zero_grad()
            ((ours(distgrad.tensor(xs)) - distgrad.tensor(ys)) ** 2).mean().backward()
            o1.step()
            o2.zero_grad()
            ((theirs(torch.from_numpy(xs)) - torch.from_numpy(ys)) ** 2).mean().backward()
            o2.step()
        err = max(float(np.abs(p.detach().numpy() - q.detach().numpy()).max())
                  for p, q in zip(ours.parameters(), theirs.parameters()))
        assert err < 1e-5, err
        return err
    finally:
        tdist.destroy_process_group()


class Branches(nn.Module):
    """``a`` is used on every rank, ``b`` only where ``use_b``, ``c`` nowhere."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x, use_b):
        y = self.a(x)
        return y + self.b(y) if use_b else y


@case
def unused_parameters(ctx, in_place=None):
    distgrad.manual_seed(0)
    with in_place_from(in_place):
        model = ddp(ctx, Branches(), find_unused_parameters=True)
    x = distgrad.ones(2, 4) * (ctx.rank + 1)
    use_b = ctx.rank == 0
    model(x, use_b).sum().backward()
    m = model.module
    assert m.c.weight.grad is None and m.c.bias.grad is None  # used by no rank
    # b's gradient is rank 0's divided by the world size, on every rank
    distgrad.manual_seed(0)
    ref = Branches()
    ref(distgrad.ones(2, 4), True).sum().backward()
    np.testing.assert_allclose(m.b.weight.grad.numpy(), ref.b.weight.grad.numpy() / N,
                               rtol=1e-6)
    # a second iteration works (nothing left pending)
    model.zero_grad()
    model(x, not use_b).sum().backward()
    return [m.b.weight.grad.sum().item(), m.a.weight.grad.sum().item()]


@case
def shared_grad_memory(ctx):
    """Two parameters whose .grad is one array (assigned so by hand) are not reduced in it:
    the collective would write there while backward still adds the other's gradient (the
    result depended on timing, 1 run in 3 under load). They take the buckets, and the
    result is theirs."""
    results = []
    for nbytes in (None, 64):
        with in_place_from(nbytes):
            distgrad.manual_seed(0)
            model = ddp(ctx, Branches())
        m = model.module
        m.a.weight.grad = m.b.weight.grad = distgrad.zeros(4, 4)
        m.c.weight.grad = distgrad.zeros(4, 4)
        x = distgrad.ones(2, 4) * (ctx.rank + 1)
        (model(x, True).sum() + m.c(x).sum() * 0).backward()
        results.append([p.grad.numpy().tolist() for p in m.parameters()])
        if nbytes:  # neither shared .grad was a collective's target; c's own one was
            index = {id(p): i for i, p in enumerate(model._params)}
            targets = [model._where[index[id(p)]][0].target is not None
                       for p in (m.a.weight, m.b.weight, m.c.weight)]
            assert targets == [False, False, True], targets
    assert results[0] == results[1], results
    return results[1]


@case
def unused_without_detection(ctx):
    model = ddp(ctx, Branches())
    model(distgrad.ones(2, 4), False).sum().backward()
    try:
        model(distgrad.ones(2, 4), False)
    except RuntimeError as e:
        assert "Expected to have finished reduction in the prior iteration" in str(e)
        assert "b.weight" in str(e)
        return True
    raise AssertionError("no error for parameters that got no gradient")


@case
def model_mismatch(ctx):
    width = 16 if ctx.rank == 0 else 17
    try:
        ddp(ctx, mlp(0, width=width))
    except RuntimeError as e:
        return str(e)
    raise AssertionError("different models were accepted")


@case
def buffers(ctx):
    net = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    bn = net[1]
    bn.running_mean.data = distgrad.full((3,), float(ctx.rank))
    model = ddp(ctx, net)
    assert bn.running_mean.tolist() == [0.0] * 3  # rank 0's, from the construction
    bn.running_mean.data = distgrad.full((3,), float(ctx.rank) + 1)
    model.eval()
    model(distgrad.ones(2, 3))  # every forward starts from rank 0's buffers
    return bn.running_mean.tolist()
