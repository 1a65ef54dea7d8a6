"""Where a distributed backward's time goes, hop by hop, along a chain of processes.

The chain of ``bench_chain.py``: the coordinator (rank 0) sends 16 floats through every
worker with nested ``rpc_sync`` calls, then runs ``dist_autograd.backward``, whose
gradient goes out through every worker and back: 2 (N - 1) hops, one after another.
Every process stamps the same steady clock (``time.perf_counter_ns``, system-wide on
Linux and macOS) where a gradient passes, and each hop is split into three stages:

    receive   the I/O thread read the message -> its gradients reach the part
              (header, routing, decoding, finding or starting the part)
    process   the part has them -> it ships the next gradients
              (the graph's nodes up to the recv node, the wave's hand-over to shipping)
    wire      shipped -> the next process's I/O thread read the message
              (encoding, the zmq send, ZeroMQ's threads, the receiver's poll waking up
              and its reading of the frames)

The table shows each stage's median per hop (over every hop of every measured
backward) and what the path of 2 (N - 1) hops adds up to, beside the backward's median
wall time and the floor: as many one-way trips of raw pyzmq (half its round trip of the
same array between two processes, measured in the same run). The stamps are wrappers
around distgrad's functions (about a microsecond each).

    python scripts/backward_timeline.py [--ranks 8] [--steps 300]

Prints a table and one JSON line. An analysis tool, not a target: bench_chain.py holds
the chain's targets.
"""
import argparse
import bisect
import functools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_chain import raw_round_trip_us  # noqa: E402
from bench_world_scale import chain_step  # noqa: E402
from rpc_timeline import _stamps, clear, install, stamps  # noqa: E402

_now = time.perf_counter_ns
_FLOATS = 16
# each message the I/O thread reads has its header unpacked first, one at a time
STAMPS = [("distgrad.rpc.wire", "unpack_header", "read", None),
          ("distgrad.distributed.autograd.engine", "Part.feed_all", "feed", None)]
STAGES = [("receive", "the I/O thread read the message -> its gradients reach the part"),
          ("process", "the part has them -> it ships the next gradients"),
          ("wire", "shipped -> the next process's I/O thread read the message")]


def install_all():
    """This process's stamps: arrivals, gradients handed to a part, and ships."""
    install(STAMPS)
    from distgrad.distributed.autograd.engine import Part
    flush = Part._flush

    @functools.wraps(flush)
    def stamped_flush(self):
        if self.outgoing:  # a wave leaves (the flush after a pass's last node has none)
            _stamps["ship"].append(_now())
        return flush(self)
    Part._flush = stamped_flush


def _latest(times, after, before):
    """The latest of ``times`` (sorted) after ``after`` and at or before ``before``."""
    i = bisect.bisect_right(times, before)
    return times[i - 1] if i and times[i - 1] > after else None


def hops(marks, n, start, end):
    """[(receive, process, wire) in us] of each hop of the backward between ``start`` and
    ``end``; ``marks[rank]``: that process's stamps. None when the stamps do not follow
    the chain's path (a stage that ran elsewhere, a stamp out of order)."""
    within = {r: {k: [t for t in v if start <= t <= end] for k, v in m.items()}
              for r, m in marks.items()}
    feeds = {r: list(m.get("feed", [])) for r, m in within.items()}
    ships = {r: list(m.get("ship", [])) for r, m in within.items()}
    if feeds[0]:
        feeds[0].pop(0)  # the coordinator's roots: the pass's start, not a hop's arrival
    # the ranks that ship, in the order of the path: out to the last worker, then back
    path = list(range(n)) + list(range(n - 2, 0, -1))
    used = {r: 0 for r in range(n)}
    out = []
    for i, sender in enumerate(path):
        receiver = path[i + 1] if i + 1 < len(path) else 0
        if used[sender] >= len(ships[sender]) or not feeds[receiver]:
            return None
        shipped = ships[sender][used[sender]]
        used[sender] += 1
        arrived = next((t for t in feeds[receiver] if t > shipped), None)
        read = _latest(within[receiver].get("read", []), shipped, arrived) \
            if arrived is not None else None
        if arrived is None or read is None:
            return None
        feeds[receiver].remove(arrived)
        processed = None
        if i + 1 < len(path):  # the receiver ships on (the coordinator's arrival ends it)
            nxt = ships[receiver][used[receiver]] if used[receiver] < len(ships[receiver]) \
                else None
            if nxt is None or nxt < arrived:
                return None
            processed = (nxt - arrived) / 1000
        out.append(((arrived - read) / 1000, processed, (read - shipped) / 1000))
    return out


def measure(n, steps):
    import backward_timeline as me
    import distgrad
    from distgrad.distributed import autograd as dist_autograd
    from distgrad.distributed import rpc
    from distgrad.testing.world import World
    world = World(n - 1, transport="tcp", num_worker_threads=4,
                  allowed_modules=["backward_timeline", "rpc_timeline",
                                   "bench_world_scale"]).start()
    x = distgrad.ones(_FLOATS, requires_grad=True)
    workers = [f"worker{k}" for k in range(1, n)]
    try:
        me.install_all()
        for w in workers:
            rpc.rpc_sync(w, me.install_all)
        spans = []

        def step():
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("worker1", chain_step, (x, 1, n, "worker"))
                t0 = _now()
                dist_autograd.backward(cid, [y.sum()])
                spans.append((t0, _now()))
        for _ in range(50):
            step()
        for w in workers:
            rpc.rpc_sync(w, me.clear)
        me.clear()
        spans.clear()
        for _ in range(steps):
            step()
        marks = {0: stamps()}
        for k, w in enumerate(workers, 1):
            marks[k] = rpc.rpc_sync(w, me.stamps)
    finally:
        world.close()
    marks = {r: {k: sorted(v) for k, v in m.items()} for r, m in marks.items()}
    per_step = [hops(marks, n, a, b) for a, b in spans]
    walls = [(b - a) / 1000 for a, b in spans]
    return per_step, walls, raw_round_trip_us()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8, help="processes in the chain (>= 2)")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    if args.ranks < 2:
        ap.error("--ranks: a chain needs at least 2 processes")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    per_step, walls, raw_rt = measure(args.ranks, args.steps)
    followed = [h for h in per_step if h is not None]
    n_hops = 2 * (args.ranks - 1)
    wall = statistics.median(walls)
    print(f"dist_autograd.backward through a chain of {args.ranks} processes ({n_hops} hops): "
          f"{wall:.0f} us (median of {len(walls)}); raw pyzmq one way: {raw_rt / 2:.0f} us; "
          f"{len(followed)} backwards followed the chain's path")
    print(f"{'stage':8} {'':62} {'median us/hop':>14} {'x hops us':>10}")
    rows, total = [], 0.0
    for j, (name, what) in enumerate(STAGES):
        values = [h[j] for hs in followed for h in hs if h[j] is not None]
        med = statistics.median(values) if values else float("nan")
        count = n_hops - 1 if name == "process" else n_hops  # the last arrival ends it
        total += med * count
        rows.append({"stage": name, "what": what, "median_us": med, "hops": count})
        print(f"{name:8} {what:62} {med:14.1f} {med * count:10.0f}")
    print(f"{'path':8} {'the stages along the path, summed':62} {'':14} {total:10.0f}")
    print(f"{'floor':8} {'raw pyzmq, one way, x hops':62} {raw_rt / 2:14.1f} "
          f"{raw_rt / 2 * n_hops:10.0f}")
    print(json.dumps({"bench": "backward_timeline", "ranks": args.ranks, "hops": n_hops,
                      "backward_us": wall, "raw_one_way_us": raw_rt / 2,
                      "followed": len(followed), "measured": len(walls), "path_us": total,
                      "stages": rows}))


if __name__ == "__main__":
    main()
