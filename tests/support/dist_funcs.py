"""Functions the distributed autograd tests and benchmark run on workers (allowlisted: distgrad.*).

Parameters live in a per-process store under a key, so a test can rebuild the
same model in one process and compare gradients.
"""
import os
import signal
import threading
import time

import numpy as np

import distgrad
from distgrad.autograd.function import Function

_store = {}
_lock = threading.Lock()


def make_params(key, seed, shapes):
    """Create parameters (requires_grad) from ``seed``; return their values."""
    rng = np.random.default_rng(seed)
    params = [distgrad.tensor(rng.standard_normal(s) * 0.5, requires_grad=True) for s in shapes]
    with _lock:
        _store[key] = params
    return [p.detach().numpy() for p in params]


def params(key):
    return _store[key]


def layer(x, w, b):
    return distgrad.tanh(x @ w + b)


def stage(key, x):
    """tanh layers with the stored parameters ``key`` (pairs weight, bias)."""
    ps = _store[key]
    for i in range(0, len(ps), 2):
        x = layer(x, ps[i], ps[i + 1])
    return x


def stage_pair(key, x):
    """Returns the same result twice (a tensor that travels back twice)."""
    y = stage(key, x)
    return y, y


def mul_add(a, b):
    return a * b + a


def chain(key, x, nxt, key2):
    """A stage here, one on ``nxt`` (nested RPC), then combine with a local use."""
    from distgrad.rpc import api
    h = stage(key, x)
    z = api.rpc_sync(nxt, stage, (key2, h))
    return z * 2.0 + h


def chain_to(key, x, nxt, fn, key2):
    """A stage here, then ``fn(key2, h)`` on ``nxt``: the coordinator never talks to
    ``nxt``, whose part of a backward starts with the gradient this worker sends it."""
    from distgrad.rpc import api
    return api.rpc_sync(nxt, fn, (key2, stage(key, x)))


def diamond(key, x, other, key_b, key_c):
    """``a`` here feeds two calls to ``other``: its subgraph receives two gradients."""
    from distgrad.rpc import api
    a = stage(key, x)
    b = api.rpc_sync(other, stage, (key_b, a))
    c = api.rpc_sync(other, stage, (key_c, a))
    return b * c


def bounce(key, x, back_to, key2):
    """Calls back into the caller (a cycle between two workers)."""
    from distgrad.rpc import api
    h = stage(key, x)
    return api.rpc_sync(back_to, stage, (key2, h)) + h


def unused_call(key, x, other, key2):
    """Sends a tensor whose result is not used: no gradient will ever come for it."""
    from distgrad.rpc import api
    h = stage(key, x)
    api.rpc_sync(other, stage, (key2, h))
    return h


def grads_of(context_id, key):
    """Gradients of the stored parameters ``key`` in a distributed context (None if absent)."""
    from distgrad.distributed import autograd as dist_autograd
    g = dist_autograd.get_gradients(context_id)
    return [g[p].numpy() if p in g else None for p in _store[key]]


def dot_grads_of_grad_attr(key):
    return [None if p.grad is None else p.grad.numpy() for p in _store[key]]


class _Misbehave(Function):
    """Identity whose backward raises (``"raise"``) or kills this process (``"die"``)."""

    @staticmethod
    def forward(ctx, x, how):
        ctx.how = how
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        if ctx.how == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if ctx.how == "hang":
            time.sleep(3.0)
            return g
        raise ValueError("boom in backward")


def fail_in_backward(key, x):
    return _Misbehave.apply(stage(key, x), "raise")


def die_in_backward(key, x):
    return _Misbehave.apply(stage(key, x), "die")


def hang_in_backward(key, x):
    """A backward that outlives a short RPC timeout while the worker stays alive."""
    return _Misbehave.apply(stage(key, x), "hang")


# ---------------------------------------------------------------------- hooks by reference
_log = []


def log():
    """Return and clear this process's hook log."""
    out = list(_log)
    _log.clear()
    return out


def times_ten(grad):
    _log.append("tensor_ref")
    return grad * 10.0


def node_pre_log(grad_outputs):
    _log.append("node_pre_ref")


def module_bwd_log(module, grad_input, grad_output):
    _log.append(("module_bwd_ref", type(module).__name__))


def module_fwd_scale(module, args, output):
    _log.append(("module_fwd_ref", type(module).__name__))
    return output * 2.0


def raise_in_hook(grad):
    raise KeyError("hook failed on purpose")


def pack_log(t):
    _log.append("pack")
    return t


def unpack_log(t):
    _log.append("unpack")
    return t


class _EndNoter:
    """A context extension noting (or failing) the end of this process's backward parts."""

    def __init__(self, context_id, fail, stall=0.0):
        self.context_id, self.fail, self.stall = context_id, fail, stall

    def on_backward_end(self):
        from distgrad.distributed.autograd import container
        time.sleep(self.stall)
        if self.fail:
            raise ValueError("boom at the end of backward")
        grads = len(container.require_context(self.context_id).grads)
        time.sleep(0.2)  # a note made after the part's completion reply would come too late
        with _lock:
            _store.setdefault("@ends", []).append(grads)


def stage_noting_ends(key, x, fail=False, stall=0.0):
    """``stage(key, x)`` in a context whose backward parts here end with a note of how many
    leaf gradients the context holds then (``ends_noted``), or with an error; after
    ``stall`` seconds (its gradients all went out before)."""
    from distgrad.distributed.autograd import container
    cid = container.current_context_id()
    container.add_extension(cid, _EndNoter(cid, fail, stall))
    return stage(key, x)


def stage_stalling_at_end(key, x):
    """A stage whose backward part here ends 3 s after its gradients went out."""
    return stage_noting_ends(key, x, stall=3.0)


def ends_noted():
    with _lock:
        return _store.pop("@ends", [])


def stage_rref_tensor(key, x):
    """A stage whose output stays here (for rpc.remote): hooks can target it."""
    return stage(key, x)


def grads_of_module(module_rref, context_id):
    from distgrad.distributed import autograd as dist_autograd
    g = dist_autograd.get_gradients(context_id)
    return [g[p].numpy() for p in module_rref.local_value().parameters()]


def make_mlp(d, layers):
    """``layers`` x (Linear(d, d), Tanh) as a Sequential (a RemoteModule constructor)."""
    from distgrad import nn
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.Tanh())])


def slow_stage(key, x, seconds):
    import time
    time.sleep(seconds)
    return stage(key, x)


def node_post_log(grad_inputs, grad_outputs):
    _log.append("node_post_ref")


def module_fwd_pre_log(module, args):
    _log.append(("module_fwd_pre_ref", type(module).__name__))


def module_bwd_pre_log(module, grad_output):
    _log.append(("module_bwd_pre_ref", type(module).__name__))


# ---------------------------------------------------------------------- async_execution
from distgrad.rpc.functions import async_execution  # noqa: E402


@async_execution
def stage_later(key, x, delay):
    """The stage's result, delivered by a Future that a timer thread completes later."""
    from distgrad.rpc import Future
    fut = Future()
    y = stage(key, x)
    threading.Timer(delay, fut.set_result, (y,)).start()
    return fut


@async_execution
def stage_via(other, key, x):
    """A nested ``rpc_async(...).then(...)``: the reply is produced on another thread."""
    from distgrad.rpc import api
    h = stage(key, x)
    return api.rpc_async(other, mul_add, (h, h)).then(lambda f: f.value() * 2.0 + h)


def offload_stats(context_id):
    """The offload counters of this worker's hook object for ``context_id`` (None if none),
    once its writes so far are on disk (they run behind the forward pass)."""
    from distgrad.distributed.autograd.container import get_context
    ctx = get_context(context_id)
    if ctx is None:
        return None
    for ext in ctx.extensions:
        if hasattr(ext, "stats"):
            ext.flush()
            s = ext.stats
            return {"offloaded": s.tensors_offloaded, "hits": s.prefetch_hits,
                    "misses": s.prefetch_misses, "records": ext.live_records()}
    return None


def run_dirs():
    """Offload run directories of this process that exist now."""
    import glob
    import tempfile
    from distgrad.offload.disk import RUN_DIR_PREFIX
    return glob.glob(os.path.join(tempfile.gettempdir(), f"{RUN_DIR_PREFIX}{os.getpid()}-*", "*"))
