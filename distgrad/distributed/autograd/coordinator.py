"""The coordinator's side of a distributed backward: plan the pass, start the parts its
roots feed, wait for every part, abandon the pass everywhere at the first error.

The message flow and the workers' side (a process's part of a pass, and the messages that
drive it) are in :mod:`.engine`.
"""
import threading
import time
from collections import defaultdict

from distgrad.autograd._internal import as_tuple, grad_edge, make_root_grads
from distgrad._tensor import Tensor
from distgrad.rpc import RpcTimeoutError, WorkerUnreachableError

from . import container as _c
from . import engine as _e
from .recording import reachable_recvs

__all__ = ["backward", "plan"]

_SLICE = 0.02  # how often a waiting coordinator looks at the other parts for errors


def plan(context_id, root_nodes):
    """({owner rank: [send msg ids that will receive a gradient]}, ranks the roots feed directly)."""
    info, stack, direct = {}, [], set()
    for node in root_nodes:
        for r in reachable_recvs(node, context_id):
            for entry in r.upstream:
                info.setdefault(entry[0], entry)
            stack.append(r.msg_id)
            direct.add(r.src_rank)
    expected, seen = defaultdict(list), set()
    while stack:
        mid = stack.pop()
        if mid in seen:
            continue
        seen.add(mid)
        entry = info.get(mid)
        if entry is None:
            raise RuntimeError(f"distributed autograd: no record of the send node of message {mid}")
        expected[entry[1]].append(mid)
        stack.extend(entry[2])
    return expected, direct


def _check_arguments(context_id, roots, retain_graph):
    """PyTorch's binding refuses arguments of the wrong types with a TypeError."""
    if type(context_id) is not int or isinstance(roots, (str, bytes)) \
            or not (isinstance(roots, Tensor) or hasattr(roots, "__iter__")) \
            or not isinstance(retain_graph, bool):
        raise TypeError(
            "backward(): incompatible function arguments. The following argument types are "
            "supported: (context_id: int, roots: List[Tensor], retain_graph: bool = False); "
            f"got ({type(context_id).__name__}, {type(roots).__name__}, "
            f"{type(retain_graph).__name__})")


def _check_roots(roots):
    """PyTorch's checks of the roots of a distributed backward, with its messages."""
    if not roots:
        raise RuntimeError("No tensors provided for gradient computation.")
    for i, t in enumerate(roots):
        if not isinstance(t, Tensor):
            raise TypeError(f"backward(): incompatible function arguments: root {i} is a "
                            f"{type(t).__name__}, not a Tensor")
        if not t.requires_grad:
            raise RuntimeError(f"requires_grad not set on root {i} (shape {list(t.shape)})")
        if t.numel() != 1:
            raise RuntimeError(f"Tensor {i} of shape {list(t.shape)} is not a scalar, all "
                               "roots need to be scalar")
        if t.grad_fn is None:
            raise RuntimeError(f"Tensor {i} does not have a valid gradient function (a leaf: "
                               "nothing to differentiate)")


def backward(context_id, roots, retain_graph=False):
    """Run a distributed backward from ``roots`` (scalars) in context ``context_id``.

    Leaf gradients accumulate in the context on each worker (see :func:`get_gradients`);
    returns once every worker finished its part, raises the first failure.
    """
    _check_arguments(context_id, roots, retain_graph)
    ctx = _c.require_context(context_id)
    roots = as_tuple(roots)
    _check_roots(roots)
    grads = make_root_grads(roots, (None,) * len(roots), False)
    root_edges = [(grad_edge(t), g) for t, g in zip(roots, grads)]
    expected, direct = plan(context_id, [edge[0] for edge, _ in root_edges])
    agent = _c._agent()
    me = _c.my_rank()
    pass_id = _c.new_id()
    mine = expected.pop(me, ())
    # A worker the roots feed directly learns its part with its first gradient (one
    # message instead of two). The others get theirs later, through other workers, and
    # the plan rides along with the first one (module docstring): no message of their own.
    others = {r: ids for r, ids in expected.items() if r not in direct}
    p = _e.Part(ctx, pass_id, mine, retain_graph, root_edges, plan=others or None)
    p.parts = parts = {}
    p.unstarted = {r: ids for r, ids in expected.items() if r in direct}
    reported = _e.await_reports(context_id, pass_id, others)
    parts.update(reported)
    try:
        for rank in others:
            agent.follow(rank)  # its death must end the pass although no call to it waits
        with ctx.lock:
            ctx.passes[pass_id] = p
        with _c.scope(None):
            for rank in expected:
                if agent.workers[rank].name in ctx.extended_peers:
                    # its part starts with its first gradient, but its extensions
                    # (offloading's read-ahead) should start now, while this process runs
                    # its own part
                    agent.call(rank, _e._backward_starting, (context_id,), None, -1)
        _c.backward_starts(ctx)
        p.deferred, p.defer_thread = [], threading.get_ident()
        try:
            p.feed(None, root_edges)
        finally:
            deferred, p.deferred, p.defer_thread = p.deferred, None, None
        p._maybe_complete()
        _start_deferred(agent, p, parts, deferred)
        _wait_all(agent, context_id, pass_id, parts, p, reported)
    finally:
        _e.stop_awaiting(context_id, pass_id)


# Every message of a pass uses the RPC default timeout (``rpc_timeout``, 60 s unless
# configured): a worker that stays alive (heartbeats answered) but never finishes its
# part fails the pass with a timeout naming it, instead of hanging the coordinator.


def _start_deferred(agent, p, parts, deferred):
    """Start the parts held back by the roots' execute(), then end the local part if its
    end waited for them (its deferred weight gradients are computed while they run)."""
    try:
        with _c.scope(None):
            for rank, args in deferred or ():
                parts[rank] = agent.call(rank, _e._run_pass, args, None, -1)
    finally:
        if p.end_held:
            p.end_held = False
            p._end()


def _wait_all(agent, context_id, pass_id, parts, local, reported):
    """Wait for the local part, then for every worker's; stop at the first error.

    ``parts`` grows while the local part runs (workers started by their first gradient);
    ``reported`` are the parts that report by ``_part_done``, watched meanwhile.
    """
    error, finished = None, set()
    me = agent.rank if agent is not None else 0  # without RPC: a pass of this process alone
    timeout = agent.options.rpc_timeout if reported else None
    deadline = time.monotonic() + timeout if timeout and timeout > 0 else None
    while error is None:
        if local.done.done():
            error = local.done.exception()
            if error is not None:
                break
            pending = [(r, f) for r, f in list(parts.items()) if r not in finished]
            if not pending:
                return
            fut = pending[0][1]
        else:
            pending = [(r, f) for r, f in list(parts.items()) if r not in finished]
            fut = local.done
        if not fut.wait_done(_SLICE) and reported:
            _watch_reported(agent, pass_id, reported, deadline, timeout)
        for r, f in pending:
            if f.done():
                finished.add(r)
                if f.exception() is not None:
                    error = f.exception()
                    break
    local.fail(error)
    with local.lock:
        if local.unstarted:
            local.unstarted.clear()
    pending = {r: f for r, f in list(parts.items()) if r not in finished and r != me}
    acks = []
    with _c.scope(None):
        for r in pending:
            if r != me and agent.unreachable(r) is None:
                acks.append(agent.call(r, _e._abort_pass, (context_id, pass_id), None, -1))
    for a in acks:
        try:
            a.wait(5.0)
        except Exception:  # noqa: BLE001 - best effort: the error below is what matters
            pass
    raise error


def _watch_reported(agent, pass_id, reported, deadline, timeout):
    """Fail the parts reporting by ``_part_done`` whose worker died or left, or that ran
    past the RPC timeout, as the reply of a call to them would have."""
    now = time.monotonic()
    for r, f in reported.items():
        if f.done():
            continue
        why = agent.unreachable(r)
        if why is not None:
            f._complete(None, WorkerUnreachableError(
                f"{agent.describe(r)} is unreachable: {why} (while running its part of "
                f"distributed backward pass {pass_id})"))
        elif deadline is not None and now > deadline:
            f._complete(None, RpcTimeoutError(
                f"RPC ran for more than set timeout ({timeout} s) waiting for the part of "
                f"distributed backward pass {pass_id} on {agent.describe(r)}"))
