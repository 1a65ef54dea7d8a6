"""Functions the RPC tests run on workers (allowed there by the suite's rpc_world fixture)."""
import os
import threading
import time

import numpy as np

from distgrad.rpc.functions import never_blocks, receives_caller


def echo(x):
    return x


@never_blocks
def thread_on_arrival(payload=None):
    """The name of the thread that serves it (marked: served where it arrives)."""
    return threading.current_thread().name


@never_blocks
def fail_on_arrival(msg):
    raise ValueError(msg)


def thread_name():
    """The name of the thread that serves it (unmarked: a handler thread)."""
    return threading.current_thread().name


def add(a, b):
    return a + b


def pid():
    return os.getpid()


def sleep_and_return(seconds, value=None):
    time.sleep(seconds)
    return value


def raise_value_error(msg):
    raise ValueError(msg)


def raise_key_error(key):
    return {}[key]


class CustomError(Exception):
    pass


def raise_custom(msg):
    raise CustomError(msg)


def return_unsendable():
    return threading.Lock()


def nested_call(to, func, args=()):
    """Call ``func`` on ``to`` from inside a handler."""
    from distgrad.rpc import api
    return api.rpc_sync(to, func, args)


def ping_pong(path, depth):
    """Bounce between the workers named in ``path`` ``depth`` times; return the trail."""
    from distgrad.rpc import api
    me = api.get_worker_info().name
    if depth == 0:
        return [me]
    nxt = path[(path.index(me) + 1) % len(path)]
    return [me] + api.rpc_sync(nxt, ping_pong, (path, depth - 1))


def agent_stats():
    from distgrad.rpc import current_agent
    a = current_agent()
    return dict(a.stats, rrefs=len(a.owner), pending=len(a.calls))


def rref_count():
    from distgrad.rpc import current_agent
    return len(current_agent().owner)


def make_array(n, value=1.0):
    return np.full(n, value, dtype=np.float32)


def sum_array(a):
    return float(np.asarray(a).sum())


def try_inplace(a):
    try:
        a += 1
    except ValueError:
        return "read-only"
    return "writable"


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, by=1):
        self.value += by
        return self.value

    def get(self):
        return self.value


_held = {}


def hold_rref(key, rref):
    """Keep an RRef alive on this worker (a fork)."""
    _held[key] = rref
    return rref.owner_name()


def held_to_here(key):
    return _held[key].to_here()


def drop_rref(key):
    _held.pop(key, None)
    import gc
    gc.collect()


def rref_to_here(rref):
    return rref.to_here()


def rref_increment(rref, by=1):
    return rref.rpc_sync().increment(by)


class ToyInterceptor:
    """Records every interception and tags messages: the distributed-autograd seam."""

    def __init__(self):
        self.events = []
        self.in_scope = threading.local()

    def on_send_request(self, dst, args, kwargs):
        self.events.append(("send", "request", dst.name))
        return args, kwargs, {"tag": f"request-from-{_me()}"}

    def on_receive_request(self, request, args, kwargs):
        extra = request.extra("ToyInterceptor")
        self.events.append(("recv", "request", request.worker.name, extra and extra.get("tag")))
        return args, kwargs

    def request_scope(self, request):
        import contextlib
        icpt = self
        extra = request.extra("ToyInterceptor")

        @contextlib.contextmanager
        def scope():
            icpt.in_scope.value = extra and extra.get("tag")
            try:
                yield
            finally:
                icpt.in_scope.value = None
        return scope()

    def on_send_response(self, request, value):
        self.events.append(("send", "response", request.worker.name))
        return value, {"tag": f"response-from-{_me()}"}

    def on_receive_response(self, src, extra, value):
        self.events.append(("recv", "response", src.name, extra and extra.get("tag")))
        return value


_toy = None


def _me():
    from distgrad.rpc import current_agent
    a = current_agent()
    return a.name if a else "?"


def install_toy_interceptor():
    global _toy
    from distgrad.rpc import interceptors
    _toy = ToyInterceptor()
    interceptors.add(_toy)


def remove_toy_interceptor():
    from distgrad.rpc import interceptors
    if _toy is not None:
        interceptors.remove(_toy)


def toy_events():
    return [list(e) for e in (_toy.events if _toy else [])]


def scope_tag():
    return getattr(_toy.in_scope, "value", None) if _toy else None


def thread_count():
    return threading.active_count()


def hold_gil(seconds):
    """Keep the GIL for ``seconds`` in one C call (a ctypes PyDLL call does not release it),
    as a long NumPy call or a pause would: no Python thread of this process runs meanwhile."""
    import ctypes
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))
    return os.getpid()


def busy_handlers():
    """Handler threads running a job, not counting the one running this call."""
    from distgrad.rpc import current_agent
    return current_agent().pool.busy() - 1


def thread_names():
    return sorted(t.name for t in threading.enumerate())


def shm_stats():
    from distgrad.rpc import current_agent
    a = current_agent()
    return {"pool": a.shm.stats(), "peers": sorted(a.shm.peers)}


def describe_array(a):
    a = np.asarray(a)
    return [a.dtype.str, list(a.shape), bool(a.flags.c_contiguous), a.tolist()]


def pending_calls():
    from distgrad.rpc import current_agent
    return len(current_agent().calls)


_slow_gate = threading.Event()


def wait_for_gate(timeout=30.0):
    """Block until :func:`open_gate` (a slow call the test controls)."""
    _slow_gate.wait(timeout)
    return True


def open_gate():
    _slow_gate.set()


def close_gate():
    _slow_gate.clear()


_kept = {}


def keep(key, value):
    """Hold ``value`` on this worker (arrays received through shared memory stay mapped)."""
    _kept[key] = value
    return True


_reply_probe = {}


def reply_thread_probe_start():
    """Record this handler's thread, and the thread that sends the next reply from here."""
    from distgrad.rpc import current_agent
    transport = current_agent().transport
    original = transport.reply

    def reply(ident, src, frames):
        _reply_probe.setdefault("sent", threading.get_ident())
        transport.reply = original
        return original(ident, src, frames)
    _reply_probe.clear()
    _reply_probe["ran"] = threading.get_ident()
    transport.reply = reply
    return True


def reply_thread_probe_result():
    return [_reply_probe.get("ran"), _reply_probe.get("sent")]


_installs = [0]


def count_installs():
    """An installer a header's ``@install`` may name (tests of it): counts its runs."""
    _installs[0] += 1


def installs():
    return _installs[0]


def io_socket_peers():
    """The ranks the I/O thread of this process has a socket of its own to."""
    from distgrad.rpc import current_agent
    return sorted(current_agent().transport._io_socks)


def set_quiet_sockets_interval(seconds):
    """How long, while messages flow, this process's I/O thread looks only at its busy
    sockets (``transport._QUIET_SOCKETS_EVERY``); returns the value it replaces."""
    from distgrad.rpc import transport
    old, transport._QUIET_SOCKETS_EVERY = transport._QUIET_SOCKETS_EVERY, seconds
    return old


def has_own_socket_to(rank):
    """Whether the calling thread (a handler, while it serves) has a socket of its own to
    rank ``rank``."""
    from distgrad.rpc import current_agent
    return rank in current_agent().transport.own_sockets.mine()


def ask_whether_it_has_a_socket_back(name, my_rank):
    """Call ``has_own_socket_to(my_rank)`` on worker ``name`` (a first call between them)."""
    from distgrad.distributed import rpc
    return rpc.rpc_sync(name, has_own_socket_to, (my_rank,))


@receives_caller
def who_calls(caller=None):
    """The name of the worker that called this (told by the callee's RPC layer)."""
    return caller.name


def report_part(to, context_id, pass_id, ranks):
    """Report to ``to`` the end of distributed backward pass ``pass_id``'s parts of
    ``ranks``, one one-way call each from this thread (so they arrive in this order)."""
    from distgrad.distributed.autograd import engine
    from distgrad.rpc import current_agent
    agent = current_agent()
    for rank in ranks:
        agent.notify(to, engine._part_done, (context_id, pass_id, rank, None))
    return True
