"""Serving CALLs: request object -> handler -> reply, on a pool of handler threads.

A :class:`Request` is made when a CALL arrives and travels explicitly from the
socket through the handler to the reply, also when the reply is produced later,
on another thread, by a Future (``@rpc.functions.async_execution``): whatever a
reply needs (the caller, the message id, the interceptors' state such as the
autograd context) is on the request, never in a thread-local.

The reply leaves from the thread that produced it, on that thread's own socket
(``Transport.send``): one hand-off per request (the I/O thread to a handler).
Short internal operations that never block (:data:`SYSTEM_OPS`: RRef forks and
fetches, the shutdown barrier, the shared-memory probe, notices that had no ride) arrive as SYSTEM messages
and are served right on the I/O thread: no hand-off at all. So are CALLs of functions
marked :func:`~distgrad.rpc.functions.never_blocks` (launch's ``deliver``), once a handler
of this process has resolved their reference (the I/O thread never imports), when their
body is small (at most :data:`ON_ARRIVAL_MAX_BODY`: decoding it there stays short) and while
no interceptor may hold replies (fault injection sleeps in ``on_send_message``).

Every CALL whose header could be read gets a REPLY or an ERROR, whatever its
body holds: the error path needs nothing but the request's identity and message
id, and cannot itself fail.
"""
import contextlib
import logging
import sys
import traceback

from . import functions, interceptors, wire
from .errors import (BackpressureError, ProtocolError, RefusedCallError, UnknownTypeError,
                     describe_exception)
from .quota import PeerGate
from ..futures import Future

__all__ = ["Request", "Dispatcher", "SYSTEM_OPS", "ON_ARRIVAL_MAX_BODY", "run_later",
           "add_internal_op"]

#: Internal operations that never block (a value not there yet is a Future, not a wait):
#: callers send them as SYSTEM messages, served on the receiver's I/O thread.
SYSTEM_OPS = frozenset(("@rref.fetch", "@shm.probe", "@barrier", "@bk"))

#: The largest request body (bytes; arrays of 1 KiB or more ride in frames of their own) a
#: ``never_blocks`` function's call may have to be served where it arrives.
ON_ARRIVAL_MAX_BODY = 64 * 1024

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind

# ``@name`` -> function of (request, *args): internal operations of features built on RPC
# (the profiler's collection), served by every dispatcher besides the agent's own.
_extra_ops = {}


def add_internal_op(name, fn):
    """Serve ``@name`` requests with ``fn(request, *args)`` on a handler thread."""
    if not name.startswith("@") or name in SYSTEM_OPS:
        raise ValueError(f"an internal operation is named '@...' and is not a system one: "
                         f"{name!r}")
    _extra_ops[name] = fn

_FIXARRAY_4, _FIXSTR, _FIXSTR_LAST, _STR8, _STR16 = 0x94, 0xa0, 0xbf, 0xd9, 0xda


def _target_ref(body):
    """The target reference a CALL body starts with (msgpack ``[target, args, kwargs,
    remote]``), read without decoding the rest; None when it does not start that way."""
    if len(body) < 2 or body[0] != _FIXARRAY_4:
        return None
    tag = body[1]
    if _FIXSTR <= tag <= _FIXSTR_LAST:
        start, n = 2, tag - _FIXSTR
    elif tag == _STR8 and len(body) > 2:
        start, n = 3, body[2]
    elif tag == _STR16 and len(body) > 3:
        start, n = 4, (body[2] << 8) | body[3]
    else:
        return None
    try:
        return bytes(body[start:start + n]).decode()
    except UnicodeDecodeError:
        return None


class Request:
    """One incoming CALL.

    ``src`` is the caller's rank and ``worker`` its :class:`WorkerInfo`;
    ``msg_id`` and ``extras`` come from the header; ``state`` is a dict where
    interceptors keep what the reply needs; ``remote`` is ``(rref id, fork id)``
    when the result stays here as an RRef value (``rpc.remote``).
    """

    __slots__ = ("ident", "msg_id", "src", "worker", "extras", "segments", "state", "target",
                 "remote")

    def __init__(self, ident, msg_id, src, worker, extras, segments):
        self.ident, self.msg_id, self.src, self.worker = ident, msg_id, src, worker
        self.extras, self.segments = extras, segments
        self.state = {}
        self.target = None
        self.remote = None

    def extra(self, name):
        """The header extra of the interceptor installed as ``name`` (None if absent)."""
        return interceptors.extra_of(self.extras, name)

    def __repr__(self):
        return f"Request({self.target!r} from {self.worker.name!r}, msg {self.msg_id})"


def _is_async(fn):
    return getattr(fn, "_distgrad_async_execution", False) is True


def _scopes(req):
    """The interceptors' scopes of ``req`` (its autograd context, say), as one."""
    scopes = interceptors.request_scopes(req)
    if not scopes:
        return contextlib.nullcontext()
    if len(scopes) == 1:  # the usual case (distributed autograd's): no ExitStack per request
        return scopes[0]
    stack = contextlib.ExitStack()
    for s in scopes:
        stack.enter_context(s)
    return stack


def run_later(pool, req, fn, *args):
    """Run ``fn(*args)`` on a thread of ``pool`` inside ``req``'s interceptor scopes (work a
    request left for later, such as an RRef method call once its value is there)."""
    def job():
        with _scopes(req):
            fn(*args)
    pool.submit(job)


class Dispatcher:
    """Serves the requests that come to this process.

    Collaborators, given explicitly: ``name``, ``rank`` and ``world_size`` of this process,
    ``options`` (``max_message_size``), ``allowlist`` (what peers may call), ``owner`` (the
    :class:`~distgrad.rpc.owner.OwnerTable`: a ``remote()`` result stays there),
    ``internal_ops`` (``@name`` -> function of (request, *args)), ``pool`` (the
    :class:`~distgrad.rpc.pool.HandlerPool`), ``transport`` (replies leave by it),
    ``contexts`` (:class:`~distgrad.rpc.contexts.MessageContexts`: codec contexts,
    segments, copies), ``bookkeeping`` (notices ride on replies) and ``stats`` (a Counter).
    """

    def __init__(self, name, rank, world_size, options, allowlist, owner, internal_ops, pool,
                 transport, contexts, bookkeeping, stats):
        self.name, self.rank, self.options = name, rank, options
        self.allowlist, self.owner, self.internal_ops = allowlist, owner, internal_ops
        self.pool, self.transport, self.contexts = pool, transport, contexts
        self.bookkeeping, self.stats = bookkeeping, stats
        self.gate = PeerGate(world_size)  # each peer's requests decoding at once
        # references resolved here to ``never_blocks`` functions: served where they arrive
        # (looked up without resolving: the I/O thread never imports)
        self._on_arrival = set()
        self._installers_run = set()  # installers requests asked for (interceptors.py), run

    def _installing(self, request):
        """The installers ``request`` asks for that did not run here yet."""
        refs = interceptors.installers_of(request.extras)
        return [r for r in refs if r not in self._installers_run] if refs else refs

    def _install(self, refs):
        for ref in refs:
            self.allowlist.resolve(ref)()
            self._installers_run.add(ref)

    def _installed_on_arrival(self, request):
        """(I/O thread) Run the installers ``request`` asks for right away when their modules
        are imported already (the I/O thread never imports), so that they are in place
        before the next message from its sender (a notice for the interceptor, say) is
        routed; whether none is left to run on a handler (a malformed or refused one is
        reported by the handler that serves the request)."""
        try:
            refs = self._installing(request)
            if refs and all(r.partition(":")[0] in sys.modules for r in refs):
                self._install(refs)
                return True
        except Exception:  # noqa: BLE001 - the handler tries again and replies the error
            return False
        return not refs

    # ------------------------------------------------------------------ arrival (I/O thread)
    def submit(self, request, frames):
        """A CALL: serve it on a handler thread (the one hand-off of a request), once its
        peer's gate admits it to decoding (``quota.py``); refused at the peer's bound. A
        small call of a ``never_blocks`` function is served right here instead."""
        size = len(frames[0])
        installed = self._installed_on_arrival(request)
        if installed and size <= ON_ARRIVAL_MAX_BODY \
                and self._serves_on_arrival(_target_ref(memoryview(frames[0]))) \
                and not interceptors.hold_messages():  # (fault injection may sleep)
            # one at a time on this thread, each small: the gate has nothing to bound
            self.stats["served_on_arrival"] += 1
            self.serve(request, frames)
            return
        try:
            now = self.gate.admit(request.src, size, (request, frames, size))
        except BackpressureError as e:
            self.stats["refused_over_quota"] += 1
            self.reply_error(request, e)
            return
        if now:
            self._start(request, frames, size)

    def _serves_on_arrival(self, target):
        """Whether calls of ``target`` are served where they arrive: a ``never_blocks``
        function a handler resolved here before, or one whose module is imported here (its
        first call is resolved right here then: nothing to import)."""
        if target in self._on_arrival:
            return True
        if target is None or not functions.resolves_without_import(target):
            return False
        try:
            fn = self.allowlist.resolve(target)
        except Exception:  # noqa: BLE001 - refused here: the handler replies the error
            return False
        if getattr(fn, "_distgrad_never_blocks", False) is not True:
            return False
        self._on_arrival.add(target)
        return True

    @property
    def next_check(self):
        """When :meth:`on_tick` has gate work to do (a peer's full share may have stalled)."""
        return self.gate.next_check

    def on_tick(self, now):
        """(I/O thread) A peer whose full share of handler threads made no progress gets
        its waiting requests started past the share, or answered with why not
        (``quota.py``)."""
        if now < self.gate.next_check:
            return
        ready, refused = self.gate.stalled(now)
        for (request, _, _), error in refused:
            self.stats["refused_over_quota"] += 1
            self.reply_error(request, error)
        self._start_all(ready)

    def _start(self, request, frames, size):
        self.stats["handoffs"] += 1
        self.pool.submit(self._serve_gated, request, frames, size)

    def _serve_gated(self, request, frames, size):
        """A handler thread's job: serve a request its peer's gate admitted, and then, while
        each ends before running anything (a malformed or refused one: a flood of them
        holds no more threads than the gate's slots), the next ones the gate lets in."""
        job = (request, frames, size)
        while job is not None:
            src = job[0].src
            try:
                if job[0].msg_id != 0:  # its reply's connection, made while it runs
                    self.transport.connect_for_reply(job[0].ident, src)
                job = self.serve(*job[:2], gated=job[2])
            finally:
                self._start_all(self.gate.finished(src))

    def _admit_next(self, src, size, inline):
        """``src``'s request of ``size`` body bytes is decoded and checked: start the requests
        its gate lets in now; the first is returned when ``inline`` (this thread serves it)."""
        ready = self.gate.decoded(src, size)
        first = ready.pop(0) if inline and ready else None
        if first is not None:
            self.stats["handoffs"] += 1
        self._start_all(ready)
        return first

    def _start_all(self, jobs):
        for job in jobs:
            try:
                self._start(*job)
            except RuntimeError:  # the pool is shut down: this process is leaving
                return

    def serve_here(self, request, frames):
        """A SYSTEM call: serve it on this (the I/O) thread; only :data:`SYSTEM_OPS`. One that
        asks for an installer not run here yet goes to a handler (an installer may import)."""
        if not self._installed_on_arrival(request):
            self.stats["handoffs"] += 1
            self.pool.submit(self.serve, request, frames, True)
            return
        self.serve(request, frames, system=True)

    # ------------------------------------------------------------------ a handler thread
    def serve(self, req, frames, system=False, gated=None):
        """Serve one request. ``gated``: its body size, when its peer's gate counts it until
        it is decoded and checked (or answered with why not); then the gate lets the next
        ones in, and the first of them is returned if this request ended there."""
        try:
            fn, args, kwargs = self._prepare(req, frames, system)
        except BaseException as e:  # noqa: BLE001 - every error goes back to the caller
            self.reply_error(req, e)
            return None if gated is None else self._admit_next(req.src, gated, True)
        if gated is not None:
            self._admit_next(req.src, gated, False)
        try:
            with _scopes(req):
                result = fn(*args, **kwargs)
            if isinstance(result, Future) and (_is_async(fn) or req.target.startswith("@")):
                # replying never blocks: on whichever thread completes the Future
                result._add_inline_callback(lambda f: self._finish(req, f))
                return None
        except BaseException as e:  # noqa: BLE001 - every error goes back to the caller
            self.reply_error(req, e)
            return None
        self.reply(req, result)
        return None

    def _prepare(self, req, frames, system):
        """(function, args, kwargs) of a request: decoded, checked, resolved."""
        size = sum(len(f) for f in frames)
        if size > self.options.max_message_size:
            raise ProtocolError(f"request of {size} bytes exceeds max_message_size "
                                f"({self.options.max_message_size})")
        target, args, kwargs, remote = self._decode(req, frames)
        req.target = target
        if system and target not in SYSTEM_OPS:
            raise RefusedCallError(f"{target!r} may not be sent as a SYSTEM message (only "
                                   f"{sorted(SYSTEM_OPS)})")
        if remote is not None:
            self.owner.add_fork(remote[0], remote[1], 1, req.src)
            req.remote = (tuple(remote[0]), tuple(remote[1]))
        self._install(self._installing(req))  # before the interceptors read their extras
        args, kwargs = interceptors.receive_request(req, args, kwargs)
        if target.startswith("@"):
            op = self.internal_ops.get(target) or _extra_ops.get(target)
            if op is None:
                raise RefusedCallError(f"unknown internal operation {target!r}")
            return op, (req, *args), kwargs
        fn = self.allowlist.resolve(target)
        if getattr(fn, "_distgrad_never_blocks", False) is True:
            self._on_arrival.add(target)  # as many as marked functions: a few
        if getattr(fn, "_distgrad_receives_caller", False) is True:
            if "caller" in kwargs:
                raise RefusedCallError(f"{target!r} is told who calls it: a call may not name "
                                       f"its caller (keyword argument 'caller')")
            kwargs["caller"] = req.worker  # kwargs is this request's own, freshly decoded
        return fn, args, kwargs

    def _decode(self, req, frames):
        ctx = self.contexts.decode(req.src, req.segments)
        try:
            try:
                msg = wire.decode(frames[0].buffer, frames[1:], ctx)
            except UnknownTypeError:
                # a type registered by the module of the function called (or one it
                # imports), not imported here yet: import it, as the call would, if it is
                # allowed (else the refusal says so), and decode once more
                target = wire.first_item(frames[0].buffer)
                if target is None or target.startswith("@"):
                    raise
                self.allowlist.resolve(target)
                msg = wire.decode(frames[0].buffer, frames[1:], ctx)
        finally:
            self.contexts.settle(req.src, req.segments, ctx)
        if type(msg) is not list or len(msg) != 4:
            raise ProtocolError("malformed request body: expected [target, args, kwargs, remote]")
        target, args, kwargs, remote = msg
        if type(target) is not str or type(args) is not list or type(kwargs) is not dict \
                or not all(type(k) is str for k in kwargs):
            raise ProtocolError("malformed request body: target must be a string, args a "
                                "list, kwargs a map of names")
        if remote is not None and not (type(remote) is list and len(remote) == 2):
            raise ProtocolError(f"malformed request body: remote reference {remote!r}")
        return target, tuple(args), kwargs, remote

    def _finish(self, req, fut):
        exc = fut.exception()
        if exc is not None:
            self.reply_error(req, exc)
        else:
            self.reply(req, fut.value())

    # ------------------------------------------------------------------ replies (any thread:
    # the one that produced the value sends it, on its own socket)
    def reply(self, req, value):
        ctx = None
        try:
            if req.remote is not None:
                self.allowlist.check_value(value, f"{req.target!r}")
                self.owner.set_value(req.remote[0], value)
                req.remote, value = None, None
            if req.msg_id == 0:  # a one-way call: nobody waits for an answer
                return
            value, extras = interceptors.send_response(req, value)
            extras = self.bookkeeping.ride(req.src, extras)
            ctx = self.contexts.encode(req.src)
            body, bufs = wire.encode(value, ctx)
            header = wire.pack_header(Kind.REPLY, req.msg_id, self.rank, extras,
                                      ctx.segments or None)
            copies = self.contexts.copies(req.src, "response", req.target, ctx)
        except BaseException as e:  # noqa: BLE001 - an unsendable result is the caller's error
            if ctx is not None:
                self.contexts.give_back(req.src, ctx)
            self.reply_error(req, e)
            return
        for _ in range(copies):
            self.transport.reply(req.ident, req.src, [header, body, *bufs])

    def reply_error(self, req, exc):
        try:
            if req.remote is not None:
                self.owner.set_value(req.remote[0], None, exc)
                req.remote = None
        except Exception:  # noqa: BLE001 - the error reply matters more
            log.debug("could not record the failure of an RRef value", exc_info=True)
        if req.msg_id == 0:  # a one-way call: its error has nobody to go to
            log.warning("%s: one-way call %s from %s failed: %s: %s", self.name, req.target,
                        req.worker.name, type(exc).__name__, exc)
            self.stats["one_way_errors"] += 1
            return
        try:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            body, _ = wire.encode(describe_exception(exc, tb))
        except Exception:  # noqa: BLE001 - an exception that cannot describe itself
            body, _ = wire.encode(["RuntimeError", "builtins",
                                   f"an exception of type {type(exc).__name__} was raised "
                                   "(its text could not be sent)", ""])
        self.stats["errors_replied"] += 1
        self.transport.reply(req.ident, req.src,
                             [wire.pack_header(Kind.ERROR, req.msg_id, self.rank), body])
