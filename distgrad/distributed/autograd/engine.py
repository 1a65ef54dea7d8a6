"""The distributed backward: a coordinator-driven pass over graph segments on many processes.

This module is every process's part of a pass and the messages that drive it; the
coordinator's own side (planning, starting, waiting) is :mod:`.coordinator`.

Message flow of ``backward(context_id, roots)`` on the coordinator:

1. Plan, locally: walk the coordinator's graph from the roots to the recv nodes of
   the context; their headers carried ``[send id, owner, recv ids reachable from
   that send node]`` for every send node upstream of them, so a closure over those
   entries gives exactly the send nodes that will receive a gradient (one each),
   grouped by owner. Send nodes that no gradient can reach (a result the loss does
   not use) are never waited for.
2. ``_run_pass(ctx, pass, send ids, retain, first gradients, plan)`` goes to each owner
   the roots feed directly, together with its first gradients, when the coordinator's
   engine reaches that recv node (one message; when nothing local is left to run, it
   leaves once the coordinator's execute() returns, and the coordinator's own weight
   gradients are computed while that part runs); its reply is that owner's completion.
   The other owners get no message of their own: their gradients come later, through
   other workers, and the first one carries the *plan* (``{owner rank: send ids}`` of
   every such owner), which each part passes on with its first delivery to each owner in
   it. An owner started that way reports its completion to the coordinator with a
   one-way ``_part_done``; the coordinator follows those owners' liveness and the RPC
   timeout meanwhile, so one that dies or stalls fails the pass naming it, as a call to
   it would. Each process runs one :class:`GraphTask` whose roots are exactly its
   expected send nodes (plus, on the coordinator, the roots), so nodes shared by several
   of them wait for all their gradients and nobody waits for a gradient that cannot
   come.
3. Gradients flow: when an engine runs a recv node it ships the gradient to the
   sender (``_deliver``, a one-way call), whose pass adds it at the send node and
   executes what became ready. Gradients for one peer that become ready together (a
   wave: the engine's next node is another recv node) travel as one message.
   Gradients that arrive before their ``_run_pass`` are kept. A recv node runs as
   soon as it is ready (it ranks above every op node), so a pipeline's upstream stage
   gets a micro-batch's gradient while this process goes on with the next one.
4. A process's part is complete when all its expected send nodes were fed and its
   engine is idle. It then computes the weight gradients its linear nodes left for
   later (``DEFER_WEIGHT_GRADS`` below), and the context's extensions see its end
   (``on_backward_end``, for work that must follow the part: a launch stage steps its
   optimizer there) before the part reports completion. ``backward`` returns once the
   coordinator's part and every ``_run_pass`` reply are in; the first error (a
   worker's, with its name; or a dead worker's heartbeat error) aborts the pass
   everywhere else and is raised.

The message economy of a pass, per peer and wave: one message with its gradients
(the first one to a peer also starts its part there), plus one completion per part (a
reply, or ``_part_done``). A chain through k workers therefore costs k deliveries out
and back and k completions, with no start message of its own. Deliveries need no
acknowledgement: a part completes only once all its gradients arrived, so the
completions cover them, and a peer that dies fails the pass (its call, or the
coordinator's watch of the parts that report). Releasing a context afterwards
costs no message of its own: the release is a notice that rides along on the next
message to each peer (``distgrad.rpc.bookkeeping``), acknowledged the same way.

No handler thread ever blocks waiting for another process inside a pass: gradient
shipping is asynchronous and whoever delivers a gradient runs the ready nodes,
with at most one thread executing a pass's GraphTask at a time (others queue).
``_run_pass`` and ``_deliver`` are served where they arrive, on the RPC I/O thread, and
the nodes they make ready run there too when they are distgrad's own code (no hook,
custom Function, saved-tensor hook or context extension: nothing that may block) and
this process's last run of such work was short (``_ON_ARRIVAL_BUDGET``); otherwise
they run on a handler thread. A hop of a chain of small steps then costs no thread
hand-off (``rpc/PROTOCOL.md``).
"""
import logging
import os
import threading
import time
import traceback

from distgrad.autograd._internal import (AccumulateGrad, GraphTask, execute,
                                         runs_only_builtin_code, set_task_extension)
from distgrad.autograd.deferred_weight_grads import WeightGradStore
from distgrad.rpc import Future, ProtocolError, RpcError, WorkerUnreachableError, entry_point
from distgrad.rpc.errors import describe_exception, rebuild_exception
from distgrad.rpc.functions import async_execution, never_blocks, receives_caller

from . import container as _c
from .recording import RecvNode, SendNode, install

log = logging.getLogger("distgrad.distributed.autograd")


# A pass's gradients are run where they arrive, on the RPC I/O thread (no hand-off), while
# this process's last run of backward work took less than this; a longer one would hold up
# every other message of the process, so its successors go to a handler thread. Measured in
# the running thread's CPU time: a run preempted on a busy machine is not a long one.
_ON_ARRIVAL_BUDGET = 0.001  # seconds
_last_run = 0.0              # the CPU time of this process's last run of a pass's nodes

# A part leaves its linear weights' gradients for its end, when it computes them in one
# product per weight over every micro-batch of the pass (autograd/deferred_weight_grads.py):
# the input gradients, which the stage before waits for, leave first. The part reports its
# end only after that, so a context's gradients are complete whenever anyone can read them.
# Every part defers the same weights whichever thread runs it, so a result is the same on
# every run (it differs from the plain backward's by float rounding: one product over all
# rows instead of a sum of one per micro-batch). Only a part that gains defers
# (_deferral_pays). Not deferred: weights with hooks, inputs under saved-tensor hooks
# (offloaded: they would be kept), and contexts with extensions (a launch stage defers
# its own way). Off with DISTGRAD_DEFER_WEIGHT_GRADS=0.
DEFER_WEIGHT_GRADS = os.environ.get("DISTGRAD_DEFER_WEIGHT_GRADS", "1") != "0"
# The end's products run on the I/O thread up to this many multiply-adds (about the
# on-arrival budget); more go to a handler thread.
_FLUSH_ON_ARRIVAL_MAX = 1 << 21


def _node_error(exc):
    """What an error raised while running this process's nodes becomes: PyTorch's
    ``RuntimeError("Error on Node <rank>: <message>")`` (here with the worker's name and
    the original class after it, and the original as its cause). RPC errors (a dead or
    silent peer) and errors already named by a node elsewhere keep their class."""
    msg = str(exc.args[0]) if exc.args else str(exc)
    if isinstance(exc, RpcError) or msg.startswith("Error on Node "):
        return exc
    new = RuntimeError(f"Error on Node {_c.my_rank()}: {msg} (on worker '{_c.my_name()}', "
                       f"{type(exc).__name__})")
    new.__cause__ = exc
    return new


def _named(exc):
    """``exc`` with this worker's name in front of its message (same class when possible)."""
    name = _c.my_name()
    msg = str(exc.args[0]) if exc.args else str(exc)
    if f"'{name}'" in msg:
        return exc
    try:
        new = type(exc)(f"Error on worker '{name}' during distributed backward: {msg}")
    except Exception:  # noqa: BLE001 - classes whose constructor needs more
        return exc
    new.__cause__ = exc
    return new


class Part:
    """This process's part of one distributed backward pass."""

    def __init__(self, ctx, pass_id, send_ids, retain_graph, roots=(), plan=None):
        self.ctx, self.id = ctx, pass_id
        self.retain = retain_graph
        self.plan = plan       # {rank: send ids} of the parts their first gradient starts
        self.told = set()      # ranks whose part this one's deliveries carried the plan to
        self.lock = threading.Lock()
        self.inbox = []
        self.running = False
        self.finished = False
        self.outgoing = {}     # rank -> [[recv msg id, gradient], ...] of the wave being shipped
        self.unstarted = None  # coordinator: {rank: send ids} of parts its _run_pass starts
        self.parts = None
        self.deferred = None   # coordinator: starts held back until the roots' execute() returns
        self.defer_thread = None
        self.end_held = False  # coordinator: its end waits for those starts
        self.plain = None      # whether its nodes run distgrad's code only (_runs_on_arrival)
        self.done = Future()
        sends = []
        for mid in send_ids:
            node = ctx.sends.get(mid)
            if node is None:
                raise RuntimeError(f"autograd context {ctx.id} on worker '{_c.my_name()}' has no "
                                   f"send node for message {mid}")
            if node.freed:
                raise RuntimeError(
                    f"worker '{_c.my_name()}': the graph of autograd context {ctx.id} on this "
                    "worker was already freed by a previous distributed backward. Specify "
                    "retain_graph=True if you need to backward through the graph a second time.")
            sends.append(node)
        self.sends = sends
        self.expected = set(send_ids)
        task = self.task = GraphTask(retain_graph, False, accumulate=ctx.accumulate)
        set_task_extension(task, "distributed", self)
        task.compute_dependencies(sends + [edge[0] for edge, _ in roots])
        task.weight_grads = self.weight_grads = WeightGradStore() \
            if DEFER_WEIGHT_GRADS and not ctx.extensions and _deferral_pays(ctx.id, task) \
            else None

    # -- feeding (any thread) --
    def feed(self, msg_id, g):
        self.feed_all([(msg_id, g)])

    def feed_all(self, grads):
        """Add ``[(send msg id, gradient), ...]`` (msg id None: the roots) and run what
        became ready, unless another thread runs this pass already (it will)."""
        with self.lock:
            if self.finished:
                return
            self.inbox.extend(grads)
            if self.running or not self.inbox:
                return
            self.running = True
        if _on_io_thread() and not self._runs_on_arrival():
            agent = _c._agent()
            agent.stats["backward_runs_handed_off"] += 1
            agent.run_soon(self._drain)
            return
        self._drain()

    def _runs_on_arrival(self):
        """Whether this pass's nodes may run on the RPC I/O thread, where its gradients
        arrive: only distgrad's own code (no hook, custom Function or saved-tensor hook that
        could block, no extension of the context), and short work by the last measure."""
        if self.plain is None:
            self.plain = not self.ctx.extensions and all(
                type(n) is SendNode or type(n) is RecvNode or runs_only_builtin_code(n)
                for n in self.task.graph_nodes)
        return self.plain and _last_run < _ON_ARRIVAL_BUDGET

    def _drain(self):
        global _last_run
        started = time.thread_time()
        try:
            self._drain_inbox()
        finally:
            _last_run = time.thread_time() - started

    def _drain_inbox(self):
        task = self.task
        while True:
            with self.lock:
                items, self.inbox = self.inbox, []
                if not items or self.finished:
                    self.running = False
                    break
            try:
                for msg_id, g in items:
                    if msg_id is None:
                        self._add_roots(g)
                        continue
                    if msg_id not in self.expected:
                        raise RuntimeError(f"unexpected or repeated gradient for send node "
                                           f"{msg_id} in autograd context {self.ctx.id}")
                    self.expected.discard(msg_id)
                    node = self.ctx.sends[msg_id]
                    task.add_gradient(node, 0, g)
                    task.mark_ready(node)
                execute(task)
                self._flush()  # what the last wave left (nothing ran after its recv nodes)
            except BaseException as e:  # noqa: BLE001 - the pass fails with the node's error
                self.fail(_node_error(e))
                with self.lock:
                    self.running = False
                return
        self._maybe_complete()

    def _add_roots(self, root_edges):
        task = self.task
        for (node, nr), g in root_edges:
            task.add_gradient(node, nr, g)
        marked = set()
        for (node, _), _ in root_edges:
            if node not in marked and task.dependencies.get(node, 0) == 0:
                marked.add(node)
                task.mark_ready(node)

    # -- shipping (called by RecvNode.apply inside execute) --
    def ship(self, recv, g):
        """Queue ``g`` for the peer that sent ``recv``'s tensor; the wave leaves once the
        engine's next node is not another recv node (or it has none)."""
        with self.lock:
            self.outgoing.setdefault(recv.src_rank, []).append([recv.msg_id, g])
        if type(self.task.peek_ready()) is not RecvNode:
            self._flush()

    def _flush(self):
        with self.lock:
            out, self.outgoing = self.outgoing, {}
            starts = {r: self.unstarted.pop(r) for r in out
                      if self.unstarted and r in self.unstarted}
            plan = self.plan
            tell = [r for r in out if plan and r in plan and r not in self.told]
            self.told.update(tell)
        if not out:
            return
        agent = _c._agent()
        with _c.scope(None):  # gradients are plain data: no recording
            for rank, grads in out.items():
                if rank not in starts:
                    args = (self.ctx.id, self.id, grads, self.retain, plan) if rank in tell \
                        else (self.ctx.id, self.id, grads)
                    if not agent.notify(rank, _deliver, args):
                        raise WorkerUnreachableError(
                            f"cannot ship gradients to {agent.describe(rank)}: "
                            f"{agent.unreachable(rank) or 'it left the world'}")
                    continue
                # the coordinator starts that worker's part with its first gradients
                args = (self.ctx.id, self.id, starts[rank], self.retain, grads, plan)
                if self.deferred is not None and threading.get_ident() == self.defer_thread \
                        and not self.task.has_ready_nodes():
                    # Nothing local is left to run: start it once execute() returns, and
                    # then end this part (its weight gradients) while it runs; see
                    # coordinator.py.
                    self.deferred.append((rank, args))
                    continue
                self.parts[rank] = agent.call(rank, _run_pass, args, None, -1)

    # -- completion --
    def _maybe_complete(self):
        with self.lock:
            if self.finished or self.running or self.inbox or self.expected:
                return
            self.finished = True
        if not self.retain:
            for node in self.sends:
                node.freed = True
        with self.ctx.lock:
            self.ctx.passes.pop(self.id, None)
        if self.deferred and threading.get_ident() == self.defer_thread:
            # the coordinator holds parts back until its roots' execute() returns: it
            # starts them first and ends its own part while they run (coordinator.py)
            self.end_held = True
            return
        if self.weight_grads is not None and \
                self.weight_grads.work() > _FLUSH_ON_ARRIVAL_MAX and _on_io_thread():
            agent = _c._agent()
            agent.stats["backward_ends_handed_off"] += 1
            agent.run_soon(self._end)  # a batch's products: not on the I/O thread
            return
        self._end()

    def _end(self):
        """The part ran every node: compute its deferred weight gradients, let the
        context's extensions see the end, report."""
        try:
            if self.weight_grads is not None:
                deferred = self.weight_grads.flush()
                agent = _c._agent()
                if deferred and agent is not None:
                    agent.stats["weight_grads_deferred"] += deferred
            _c.backward_ends(self.ctx)
        except BaseException as e:  # noqa: BLE001 - the flush's or an extension's error fails it
            self.done.set_exception(_node_error(e))
            return
        self.done.set_result(None)

    def fail(self, exc):
        with self.lock:
            if self.finished:
                return
            self.finished = True
        with self.ctx.lock:
            self.ctx.passes.pop(self.id, None)
            self.ctx.aborted.add(self.id)
        if self.weight_grads is not None:
            self.weight_grads.discard()  # the pass failed: its gradients are not wanted
        self.done.set_exception(exc)

    abort = fail


def _deferral_pays(context_id, task):
    """Whether a part gains by leaving its linear weights' gradients for its end: it ships
    gradients to another process (they leave sooner, and that process starts sooner), or
    a weight feeds several nodes of the pass (micro-batches: one product over all their
    rows). Otherwise the products run as the nodes do, as in a local backward, and the
    part pays no bookkeeping for them (a 4-layer stage that ships nothing, with one
    micro-batch, spent a quarter of its backward on it)."""
    dependencies = task.dependencies
    for node in task.graph_nodes:
        kind = type(node)
        if kind is RecvNode:
            if node.context_id == context_id:  # (another context's leads nowhere here)
                return True
        elif kind is AccumulateGrad and dependencies.get(node, 0) > 1:
            return True
    return False


def _on_io_thread():
    agent = _c._agent()
    transport = agent.transport if agent is not None else None
    return transport is not None and transport.on_io_thread()


# ---------------------------------------------------------------------- remote handlers
# Both are served where they arrive, on the RPC I/O thread (``never_blocks``): setting up a
# part and adding gradients take a moment, and the nodes they make ready run there too only
# when they are distgrad's own and short (``Part._runs_on_arrival``); otherwise the work
# goes to a handler thread, as it would have without the marker.
@entry_point
@never_blocks
@async_execution
def _run_pass(context_id, pass_id, send_ids, retain_graph, first=(), plan=None):
    """Runs on a worker the roots feed directly: set up its part of a pass (``first``:
    [[msg id, gradient], ...] to start with; ``plan``: see the module docstring); the reply
    is its completion."""
    ctx = _c.get_context(context_id)
    if ctx is None:
        raise _no_context(context_id)
    try:
        with ctx.lock:
            if pass_id in ctx.aborted:
                raise RuntimeError(f"distributed backward pass {pass_id} was abandoned")
            p, early = _new_part(ctx, pass_id, send_ids, retain_graph, plan)
    except BaseException as e:
        raise _named(e) from None
    out = Future()

    def relay(f):
        exc = f.exception()
        if exc is None:
            out.set_result(None)
        else:
            out.set_exception(_named(exc))
    p.done._add_inline_callback(relay)
    _start_part(ctx, p, [*early, *first])
    return out


def _no_context(context_id):
    return RuntimeError(f"worker '{_c.my_name()}' has no autograd context {context_id} "
                        "(released?)")


def _new_part(ctx, pass_id, send_ids, retain_graph, plan):
    """(this process's part of pass ``pass_id``, the gradients that came before it);
    under ``ctx.lock``."""
    p = Part(ctx, pass_id, send_ids, retain_graph, plan=plan)
    ctx.passes[pass_id] = p
    return p, ctx.early.pop(pass_id, [])


def _start_part(ctx, p, grads):
    if ctx.extensions and _on_io_thread():  # an extension's start may read ahead, or block
        _c._agent().run_soon(_run_part, ctx, p, grads)
    else:
        _run_part(ctx, p, grads)


def _run_part(ctx, p, grads):
    _c.backward_starts(ctx)
    p.feed_all(grads)
    p._maybe_complete()


@entry_point
@never_blocks
def _deliver(context_id, pass_id, grads, retain_graph=False, plan=None):
    """A one-way call: gradients ``[[send msg id, gradient], ...]`` for this process's part;
    late ones (a released context, an abandoned pass) are dropped. The first delivery to a
    part the coordinator did not start carries the ``plan`` and starts it (its completion
    goes to the coordinator as ``_part_done``)."""
    mine = plan.get(_c.my_rank()) if type(plan) is dict else None
    ctx = _c.get_context(context_id)
    if ctx is None:
        if mine is not None:
            _report(context_id, pass_id, _no_context(context_id))
        return
    try:
        with ctx.lock:
            p = ctx.passes.get(pass_id)
            if p is None:
                if pass_id in ctx.aborted:
                    return
                if mine is None:
                    ctx.early.setdefault(pass_id, []).extend(grads)
                    return
                p, early = _new_part(ctx, pass_id, mine, retain_graph, plan)
                p.done._add_inline_callback(
                    lambda f: _report(context_id, pass_id, f.exception()))
                grads = [*early, *grads]
            else:
                early = None
    except BaseException as e:  # noqa: BLE001 - the part could not start: the coordinator hears
        _report(context_id, pass_id, _named(e))
        return
    if early is None:
        p.feed_all(grads)
    else:
        _start_part(ctx, p, grads)


def _report(context_id, pass_id, exc):
    """Tell the coordinator (the pass id's creator) that this process's part of the pass
    ended, with ``exc`` when it failed."""
    agent = _c._agent()
    if agent is None:  # this process left the world: the coordinator sees it gone
        return
    error = None
    if exc is not None:
        exc = _named(exc)
        error = describe_exception(exc, "".join(traceback.format_exception(exc)))
    agent.notify(_c.creator_of(pass_id), _part_done, (context_id, pass_id, agent.rank, error))


# The parts a coordinator in this process waits for by _part_done: (context id, pass id) ->
# {rank: Future} (coordinator.py).
_reported = {}
_reported_lock = threading.Lock()


def await_reports(context_id, pass_id, ranks):
    """{rank: Future} of the parts of ``ranks`` in a pass, completed by their ``_part_done``
    (until :func:`stop_awaiting`)."""
    futures = {r: Future() for r in ranks}
    with _reported_lock:
        _reported[(context_id, pass_id)] = futures
    return futures


def stop_awaiting(context_id, pass_id):
    with _reported_lock:
        _reported.pop((context_id, pass_id), None)


@entry_point
@never_blocks
@receives_caller
def _part_done(context_id, pass_id, rank, error, caller=None):
    """A one-way call to the coordinator: worker ``rank``'s part (one the plan started)
    ended; ``error`` describes its failure, as an error reply would. Only ``rank`` itself
    reports its part (``caller``: the connection it came on): a member that reported
    another's would end the pass before that part's gradients are in."""
    if type(rank) is not int or caller is None or caller.id != rank:
        if caller is not None:
            log.warning("a report of worker %r's part of distributed backward pass %s came "
                        "from %r and was dropped", rank, pass_id, caller.name)
        return
    with _reported_lock:
        fut = _reported.get((context_id, pass_id), {}).get(rank)
    if fut is None:
        return  # late (the pass ended) or not a part it waits for
    name = _c._agent().workers[rank].name
    if error is None:
        fut._complete(None, None)
    elif type(error) is list and len(error) == 4:
        fut._complete(None, rebuild_exception(*error, name))
    else:
        fut._complete(None, ProtocolError(f"malformed report of worker {name!r}'s part of "
                                          f"distributed backward pass {pass_id}"))


@entry_point
def _backward_starting(context_id):
    """Runs on a worker: a backward of the context is starting (extensions read ahead)."""
    ctx = _c.get_context(context_id)
    if ctx is not None:
        _c.backward_starts(ctx)
    return True


@entry_point
def _abort_pass(context_id, pass_id):
    ctx = _c.get_context(context_id)
    if ctx is None:
        return False
    with ctx.lock:
        p = ctx.passes.pop(pass_id, None)
        ctx.aborted.add(pass_id)
        ctx.early.pop(pass_id, None)
    if p is not None:
        p.fail(RuntimeError(f"distributed backward pass {pass_id} was abandoned by the coordinator"))
    return True


@entry_point
def live_contexts():
    """Runs on each worker for :func:`debug_live_contexts`."""
    install()
    return _c.live_context_ids()
