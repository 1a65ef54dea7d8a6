"""Where one ``rpc_sync`` round trip's wall time goes, stage by stage, in both processes.

A world of two processes on this host; the caller sends 16 floats to a user's function
on the other (served on a handler thread, as any user's function). Both processes stamp
the same steady clock (``time.perf_counter_ns``: system-wide on Linux and macOS) where a
message passes from one stage to the next, and each stage's median and 90th percentile
over the round trips are printed in the order a round trip runs through them:

    caller thread   call -> send -> sent             (encode; zmq send)
    wire            sent -> callee I/O thread        (ZeroMQ's threads, the poll's wake-up)
    callee I/O      router -> submit -> submitted    (header, routing, admission; hand-off)
    callee handler  handler -> fn -> reply -> replied   (wake-up; decode; encode and send)
    wire            replied -> caller I/O thread
    caller I/O      router -> complete -> completed  (decode; completing the Future)
    caller thread   completed -> woke                (its wake-up)

Each stamp is a wrapper around one of distgrad's functions (about a microsecond each, so
the round trip here is a little slower than in ``bench_rpc.py``). The raw pyzmq round
trip of the same array is measured in the same run as the floor.

``--busy-cores`` runs a lowest-priority busy loop on every core meanwhile: no core is
idle when a thread is woken, so the difference shows what waking a thread on an idle core
costs on this machine (on a virtual machine, tens of microseconds a wake-up).

    python scripts/rpc_timeline.py [--calls 3000] [--busy-cores]

Prints a table and one JSON line. An analysis tool, not a target: bench_rpc.py holds the
round trip's target.
"""
import argparse
import bisect
import collections
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# (module, attribute, stamp on entry, stamp on return) in each process
CALLER_STAMPS = [
    ("distgrad.rpc.agent", "Agent.call", "call", None),
    ("distgrad.rpc.caller", "Caller._send", "send", "sent"),
    ("distgrad.rpc.transport", "Transport._on_router", "router", None),
    ("distgrad.rpc.caller", "Caller.complete", "complete", "completed"),
    ("distgrad.futures", "Future.wait", None, "woke"),
]
CALLEE_STAMPS = [
    ("distgrad.rpc.transport", "Transport._on_router", "router", None),
    ("distgrad.rpc.dispatch", "Dispatcher._start", "submit", "submitted"),
    ("distgrad.rpc.dispatch", "Dispatcher._serve_gated", "handler", None),
    ("distgrad.rpc.dispatch", "Dispatcher.reply", "reply", "replied"),
]
# the round trip's path through the stamps (C: caller, S: callee), and what each step is
PATH = [
    ("C.call", "C.send", "caller: the call up to its send (encode, header, admission)"),
    ("C.send", "C.sent", "caller: zmq send"),
    ("C.sent", "S.router", "wire: ZeroMQ's threads, the callee's I/O thread wakes"),
    ("S.router", "S.submit", "callee I/O: receive, header, routing, gate"),
    ("S.submit", "S.submitted", "callee I/O: hand the request to a handler"),
    ("S.submitted", "S.handler", "callee: the handler thread wakes"),
    ("S.handler", "S.fn", "callee handler: decode, resolve, scopes"),
    ("S.fn", "S.reply", "callee handler: the function"),
    ("S.reply", "S.replied", "callee handler: encode the reply, zmq send"),
    ("S.replied", "C.router", "wire: back, the caller's I/O thread wakes"),
    ("C.router", "C.complete", "caller I/O: receive, header, routing, decode"),
    ("C.complete", "C.completed", "caller I/O: complete the Future"),
    ("C.completed", "C.woke", "caller: the waiting thread wakes"),
]

# Stamps of the other process that follow a message's send, not the stage before them
# in PATH: the callee may stamp a message's arrival before the caller's send returned.
CAUSE = {"S.router": "C.send", "C.router": "S.reply"}

_stamps = collections.defaultdict(list)
_now = time.perf_counter_ns


def echo(x):
    """The function called (served on a handler thread)."""
    _stamps["fn"].append(_now())
    return x


def _stamped(fn, enter, leave):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if enter:
            _stamps[enter].append(_now())
        try:
            return fn(*args, **kwargs)
        finally:
            if leave:
                _stamps[leave].append(_now())
    return wrapper


def install(stamps):
    """Wrap this process's functions named in ``stamps`` (run in each process once)."""
    for module, attr, enter, leave in stamps:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, _stamped(getattr(owner, name), enter, leave))


def clear():
    _stamps.clear()


def stamps():
    return {k: list(v) for k, v in _stamps.items()}


def _busy_loops():
    """One lowest-priority busy loop per core (killed by the caller); none is left running
    when starting one of them fails."""
    loop = [sys.executable, "-c", "while True: pass"]
    started = []
    try:
        for _ in range(os.cpu_count() or 1):
            started.append(subprocess.Popen(loop, preexec_fn=lambda: os.nice(19)))
    except BaseException:
        _stop(started)
        raise
    return started


def _stop(processes):
    for p in processes:
        p.kill()
        p.wait()


def _stages(ours, theirs, n):
    """({(from, to): [microseconds per round trip]}, how many round trips that is) of the
    ``n`` measured round trips. Each round trip is followed along PATH from its own call:
    a stage's stamp is the first one after the stage before it (or after the send it
    follows, ``CAUSE``) and before the next call. A round trip missing a stamp there (a
    message that was read together with another, say, on a loaded machine) is left out
    rather than paired with another's stamps."""
    marks = {f"C.{k}": sorted(v) for k, v in ours.items()}
    marks.update({f"S.{k}": sorted(v) for k, v in theirs.items()})
    calls = marks["C.call"][:n]
    out = {p[:2]: [] for p in PATH}
    followed = 0
    for i, start in enumerate(calls):
        end = calls[i + 1] if i + 1 < len(calls) else float("inf")
        at = {"C.call": start}
        for a, b, _ in PATH:
            times = marks.get(b, [])
            j = bisect.bisect_left(times, at[CAUSE.get(b, a)])
            if j == len(times) or (b.startswith("C.") and times[j] >= end):
                break
            at[b] = times[j]
        else:
            followed += 1
            for a, b, _ in PATH:
                out[(a, b)].append((at[b] - at[a]) / 1000)
    return out, followed


def measure(calls):
    # the functions the worker runs travel by reference: this file as the module it is
    # there, not as __main__ (whose stamps would be another dict here too)
    import rpc_timeline as me
    from bench_rpc import RawClient
    from distgrad.distributed import rpc
    from distgrad.testing.world import World
    raw = RawClient()
    world = World(1, transport="tcp", num_worker_threads=4,
                  allowed_modules=["rpc_timeline"]).start()
    small = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    try:
        me.install(CALLER_STAMPS)
        rpc.rpc_sync("worker1", me.install, (CALLEE_STAMPS,))
        for _ in range(300):
            rpc.rpc_sync("worker1", me.echo, (small,))
            raw(small)
        rpc.rpc_sync("worker1", me.clear)
        me.clear()
        started = time.perf_counter()
        for _ in range(calls):
            rpc.rpc_sync("worker1", me.echo, (small,))
        per_call = (time.perf_counter() - started) / calls * 1e6
        theirs = rpc.rpc_sync("worker1", me.stamps)
        ours = me.stamps()
        raw_times = []
        for _ in range(calls):
            t = time.perf_counter()
            raw(small)
            raw_times.append((time.perf_counter() - t) * 1e6)
        return (per_call, statistics.median(raw_times), *_stages(ours, theirs, calls))
    finally:
        world.close()
        raw.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--busy-cores", action="store_true",
                    help="a lowest-priority busy loop on every core meanwhile")
    args = ap.parse_args()
    loops = _busy_loops() if args.busy_cores else []
    try:
        per_call, raw_rt, stages, followed = measure(args.calls)
    finally:
        _stop(loops)
    if not followed:
        raise SystemExit(f"none of the {args.calls} round trips had every stamp in order")
    print(f"rpc_sync of 16 floats to a handler-served function: {per_call:.1f} us a call "
          f"(stamped); raw pyzmq round trip: {raw_rt:.1f} us"
          + ("; a busy loop on every core" if args.busy_cores else ""))
    print(f"{'stage':58} {'median us':>10} {'p90 us':>8}")
    out, total = [], 0.0
    for a, b, what in PATH:
        d = sorted(stages[(a, b)])
        med, p90 = statistics.median(d), d[int(0.9 * (len(d) - 1))]
        total += med
        out.append({"from": a, "to": b, "what": what, "median_us": med, "p90_us": p90})
        print(f"{what:58} {med:10.1f} {p90:8.1f}")
    print(f"{'sum of the medians':58} {total:10.1f}")
    print(f"{followed} of {args.calls} round trips had every stamp in order (the others are "
          "left out)")
    print(json.dumps({"bench": "rpc_timeline", "busy_cores": args.busy_cores,
                      "per_call_us": per_call, "raw_rt_us": raw_rt, "calls": args.calls,
                      "followed": followed, "stages": out}))


if __name__ == "__main__":
    main()
