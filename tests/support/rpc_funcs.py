"""Functions the RPC tests run on workers (importable everywhere, allowed by default)."""
import os
import threading
import time

import numpy as np


def echo(x):
    return x


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
    from distgrad.rpc.agent import current_agent
    a = current_agent()
    return dict(a.stats, rrefs=len(a.rrefs), pending=len(a._pending))


def rref_count():
    from distgrad.rpc.agent import current_agent
    return len(current_agent().rrefs)


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

    def on_send(self, kind, dst_name, payload):
        self.events.append(("send", kind, dst_name))
        return payload, {"tag": f"{kind}-from-{_me()}"}

    def on_receive(self, kind, src_name, extra, payload):
        self.events.append(("recv", kind, src_name, extra and extra.get("tag")))
        return payload

    def request_scope(self, src_name, extra):
        import contextlib
        icpt = self

        @contextlib.contextmanager
        def scope():
            icpt.in_scope.value = extra and extra.get("tag")
            try:
                yield
            finally:
                icpt.in_scope.value = None
        return scope()


_toy = None


def _me():
    from distgrad.rpc.agent import current_agent
    a = current_agent()
    return a.name if a else "?"


def install_toy_interceptor():
    global _toy
    from distgrad.rpc.agent import set_message_interceptor
    _toy = ToyInterceptor()
    set_message_interceptor(_toy)


def remove_toy_interceptor():
    from distgrad.rpc.agent import set_message_interceptor
    set_message_interceptor(None)


def toy_events():
    return [list(e) for e in (_toy.events if _toy else [])]


def scope_tag():
    return getattr(_toy.in_scope, "value", None) if _toy else None


def thread_count():
    return threading.active_count()
