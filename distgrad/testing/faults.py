"""Message faults for users' tests: delay, drop, duplicate or fail the messages that match.

    world = rpc_world(2)
    world.faults.drop(fn=mylib.step, dst="worker2", nth=3)   # the 3rd call is lost
    world.faults.delay(0.5, fn="mylib:*", kind="response")    # mylib's replies leave late
    world.faults.duplicate(fn=mylib.append)                   # the callee runs it twice
    rule = world.faults.fail(fn=mylib.load, error=ConnectionError, p=0.2, seed=7)
    ...
    assert rule.fired() == 1

A rule is data, installed on every rank of the world (or the ranks named by
``src``), where an interceptor (``on_send_message``, see
``distgrad/rpc/interceptors.py``) judges each message that rank *sends*:

``fn``     ``module:qualname`` glob of the function called (a request) or answered
           (a response), or the function itself; default: any function. The RPC
           layer's internal operations (``@rref.fetch``, ``@barrier``...) match
           only a pattern that starts with ``@``; the harness's own calls never.
``dst``    name (glob) or rank of the receiving worker; default: any. A response
           goes back to the caller: to fault the replies of worker2, use ``src``.
``src``    the workers whose sent messages the rule judges; default: all.
``kind``   ``"request"`` (default), ``"response"`` or ``"any"``.
``nth``    act on the nth matching message only (1-based; with ``times``, from the
           nth on); ``times`` caps how often the rule acts; ``p`` acts on each
           candidate with probability ``p``, drawn from a generator seeded by
           ``seed``, the rule's filter and the rank: the same messages in the same
           order meet the same faults in every run.

Counting is per sending process: "the nth message" is the nth this rank sends.
What each fault does to the program under test is what the real one would do:
a dropped request or response leaves its caller waiting until its RPC timeout
(``RpcTimeoutError``); a duplicated request runs twice on the callee, the copies served
concurrently like any two requests, so in no fixed order with later calls (the
second reply is discarded as late); a delayed message holds the thread that sends it
(the caller's for a request, the handler's for a response) for ``seconds``; a
failed request raises ``error`` in its caller, a failed response reaches the
caller as that remote error.
"""
import builtins
import fnmatch
import itertools
import random
import threading
import time

from distgrad.rpc import errors as rpc_errors
from distgrad.rpc import interceptors
from distgrad.rpc.allowlist import ref_of

__all__ = ["Faults", "FaultRule", "install", "uninstall", "counts"]

ACTIONS = ("delay", "drop", "duplicate", "fail")
KINDS = ("request", "response", "any")
_HARNESS_CALLS = "distgrad.testing.remote:"
_ERROR_MODULES = {"builtins": builtins, "distgrad.rpc.errors": rpc_errors}
_INTERCEPTOR_NAME = "distgrad-faults"


def error_name(error):
    """``module.Name`` of an exception class every rank can rebuild (a built-in one or one
    of distgrad.rpc's errors)."""
    if isinstance(error, str):
        module, _, name = error.rpartition(".")
        module = module or "builtins"
    elif isinstance(error, type) and issubclass(error, Exception):
        module, name = error.__module__, error.__qualname__
    else:
        raise TypeError(f"fail(error=...) takes an exception class, not {error!r}")
    cls = getattr(_ERROR_MODULES.get(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        raise TypeError(f"fail(error={error!r}): the error must be a built-in exception or one "
                        "of distgrad.rpc's errors, so that every rank can raise it")
    return f"{module}.{name}"


def _error_class(full_name):
    module, _, name = full_name.rpartition(".")
    return getattr(_ERROR_MODULES[module], name)


class _Rule:
    """One rule as a sending process applies it (validated: the spec came over RPC)."""

    def __init__(self, spec, rank):
        self.id = spec["id"]
        if type(self.id) is not int:
            raise TypeError("fault rule id must be an int")
        self.action = spec["action"]
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}")
        self.fn, self.dst, self.kind = spec.get("fn"), spec.get("dst"), spec.get("kind", "request")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        self.first = spec.get("nth") or 1
        self.times = spec.get("times")
        self.p = spec.get("p")
        self.seconds = float(spec.get("seconds") or 0.0)
        self.error = spec.get("error")
        if self.error is not None:
            error_name(self.error)
        self.message = spec.get("message") or ""
        # seeded by what the rule is, not by its id (which depends on earlier tests)
        self.rng = random.Random("/".join(str(spec.get(k)) for k in (
            "seed", "action", "fn", "dst", "kind", "nth", "times", "p")) + f"/{rank}")
        self.matched = self.fired = 0

    def matches(self, dst, kind, what):
        if what.startswith(_HARNESS_CALLS) or (self.kind != "any" and kind != self.kind):
            return False
        if self.fn is None:
            if what.startswith("@"):
                return False
        elif not fnmatch.fnmatchcase(what, self.fn):
            return False
        return self.dst is None or fnmatch.fnmatchcase(dst.name, self.dst)

    def acts(self):
        """A matching message: does the rule act on it? (under the injector's lock)"""
        self.matched += 1
        if self.matched < self.first or (self.times is not None and self.fired >= self.times):
            return False
        if self.p is not None and self.rng.random() >= self.p:
            return False
        self.fired += 1
        return True


class _Injector:
    """The interceptor of this process: every rule installed here, judged in order."""

    def __init__(self):
        self.rules = []
        self.lock = threading.Lock()

    def on_send_message(self, dst, kind, what):
        copies, delay, error = None, 0.0, None
        with self.lock:
            for r in self.rules:
                if not (r.matches(dst, kind, what) and r.acts()):
                    continue
                if r.action == "delay":
                    delay += r.seconds
                elif r.action == "drop":
                    copies = 0
                elif r.action == "duplicate":
                    copies = 2 * (copies if copies is not None else 1)
                elif error is None:
                    text = f"injected fault: {r.message or 'fail'} ({kind} {what} to {dst.name})"
                    error = _error_class(r.error)(text)
        if delay:
            time.sleep(delay)
        if error is not None:
            raise error
        return copies


_injector = _Injector()


def install(spec):
    """Apply the rule ``spec`` (a dict, see :class:`Faults`) to what this process sends."""
    from distgrad.rpc import current_agent
    agent = current_agent()
    rule = _Rule(spec, agent.rank if agent is not None else 0)
    with _injector.lock:
        _injector.rules = [r for r in _injector.rules if r.id != rule.id] + [rule]
    interceptors.add(_injector, _INTERCEPTOR_NAME)


def uninstall(ids=None):
    """Remove the rules ``ids`` (all if None); the interceptor goes with the last one."""
    with _injector.lock:
        _injector.rules = [r for r in _injector.rules if ids is not None and r.id not in ids]
        empty = not _injector.rules
    if empty:
        interceptors.remove(_injector)


def counts():
    """{rule id: how often it acted in this process}."""
    with _injector.lock:
        return {str(r.id): r.fired for r in _injector.rules}


class FaultRule:
    """A rule installed on a world: ``fired()`` counts its faults on every rank."""

    def __init__(self, faults, id, names):
        self.faults, self.id, self.names = faults, id, names

    def fired(self):
        return self.faults.fired(self)

    def remove(self):
        self.faults.remove(self)

    def __repr__(self):
        return f"FaultRule({self.faults.specs[self.id]})"


class Faults:
    """The faults of one :class:`~distgrad.testing.world.World` (``world.faults``)."""

    def __init__(self, world):
        self.world = world
        self.specs = {}
        self.rules = {}
        self._ids = itertools.count(1)

    def delay(self, seconds, **where):
        """Hold each matching message ``seconds`` before it leaves."""
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"delay(seconds={seconds!r}): must be a number >= 0")
        return self._add("delay", {"seconds": float(seconds)}, **where)

    def drop(self, **where):
        """Lose each matching message (its caller waits until its RPC timeout)."""
        return self._add("drop", {}, **where)

    def duplicate(self, **where):
        """Send each matching message twice."""
        return self._add("duplicate", {}, **where)

    def fail(self, error=RuntimeError, message=None, **where):
        """Fail each matching message with ``error(message)`` (raised in the caller of a
        request; the error reply of a response)."""
        return self._add("fail", {"error": error_name(error), "message": message}, **where)

    def _add(self, action, extra, fn=None, dst=None, src=None, kind="request", nth=None,
             times=None, p=None, seed=0):
        if fn is not None and not isinstance(fn, str):
            fn = ref_of(fn)
        if dst is not None:
            dst = self._name(dst, "dst", glob=True)
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: must be one of {KINDS}")
        for arg, v in (("nth", nth), ("times", times)):
            if v is not None and (type(v) is not int or v < 1):
                raise ValueError(f"{arg}={v!r}: must be an int >= 1")
        if p is not None and not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"p={p!r}: must be a probability in (0, 1]")
        if type(seed) is not int:
            raise TypeError(f"seed={seed!r}: must be an int")
        if nth is not None and times is None:
            times = 1  # "the nth message": that one only
        srcs = self.world.names if src is None else [
            self._name(s, "src") for s in (src if isinstance(src, (list, tuple)) else [src])]
        rid = next(self._ids)
        spec = {"id": rid, "action": action, "fn": fn, "dst": dst, "kind": kind, "nth": nth,
                "times": times, "p": p, "seed": seed, **extra}
        _Rule(spec, 0)  # the same validation the ranks make, with errors raised here
        for name in srcs:
            self._on(name, "add_fault", spec)
        self.specs[rid] = spec
        self.rules[rid] = srcs
        return FaultRule(self, rid, srcs)

    def _name(self, who, arg, glob=False):
        names = self.world.names
        if isinstance(who, int) and not isinstance(who, bool) and 0 <= who < len(names):
            return names[who]
        name = getattr(who, "name", who)  # a WorkerInfo
        if isinstance(name, str) and (name in names or glob and any(c in name for c in "*?[")):
            return name
        raise ValueError(f"{arg}={who!r}: not a worker of this world ({', '.join(names)})")

    def _on(self, name, function, *args):
        if name == self.world.names[0]:
            return {"add_fault": install, "remove_faults": uninstall,
                    "fault_counts": counts}[function](*args)
        if not self.world.alive(name) or name in self.world.paused:
            return None
        return self.world.remote(name, function, *args)

    def fired(self, rule=None):
        """How often ``rule`` (all rules if None) acted, summed over the ranks."""
        ids = self.rules if rule is None else [rule.id if isinstance(rule, FaultRule) else rule]
        total = 0
        for name in dict.fromkeys(n for i in ids for n in self.rules.get(i, ())):
            got = self._on(name, "fault_counts") or {}
            total += sum(got.get(str(i), 0) for i in ids)
        return total

    def remove(self, rule):
        rid = rule.id if isinstance(rule, FaultRule) else rule
        for name in self.rules.pop(rid, ()):
            self._on(name, "remove_faults", [rid])
        self.specs.pop(rid, None)

    def clear(self):
        """Remove every rule of this world, on every rank."""
        for rid in list(self.rules):
            self.remove(rid)

    def uninstall_here(self):
        """This process's part, when the world closes (the workers' die with them)."""
        if self.rules:
            uninstall(list(self.rules))
            self.rules.clear()
