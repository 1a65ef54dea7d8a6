"""Functions the benchmarks run on their worker processes (allowed there by name)."""
import numpy as np

from distgrad.rpc.functions import never_blocks


def echo(x):
    return x


@never_blocks
def echo_on_arrival(x):
    """``echo`` marked ``never_blocks``: the callee serves it on its I/O thread."""
    return x


def make_mlp(d, layers):
    """``layers`` x (Linear(d, d), Tanh) as a Sequential (a RemoteModule constructor)."""
    from distgrad import nn
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(d, d), nn.Tanh())])


def nbytes(x):
    return int(np.asarray(x).nbytes)


def process_stats():
    """(RSS in MB, threads, open file descriptors) of this process (Linux /proc)."""
    import os
    import threading
    rss = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return [rss, threading.active_count(), len(os.listdir("/proc/self/fd"))]


def message_counts():
    """(messages, bytes) this process's RPC agent has sent so far."""
    from distgrad.rpc import current_agent
    stats = current_agent().stats
    return [stats["messages_sent"], stats["bytes_sent"]]


def forge_for(seconds, victims, rate=200):
    """A forging peer, for ``seconds``: run on a member, it sends every ``victims`` rank,
    ``rate`` times a second, what issue 22's attacker sent, claiming another rank (with
    its own credential: a member forging) and again without credentials on a fresh
    connection (an outsider). Returns {"refused": answers refusing it, "served": answers
    serving it (must stay 0), "sent": messages queued, "unsent": messages that found no
    connection to be queued on}."""
    import time

    import msgpack
    import zmq

    from distgrad.rpc import current_agent, wire
    agent = current_agent()
    t = agent.transport
    me = agent.rank
    out = {"refused": 0, "served": 0, "sent": 0, "unsent": 0}
    ctx = zmq.Context()
    members = {}
    try:
        for v in victims:
            s = members[v] = ctx.socket(zmq.DEALER)
            s.linger = 0
            for option, value in t.client_options(v).items():
                setattr(s, option, value)
            s.connect(t.endpoints[v])
        end, mid = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            for v in victims:
                other = (v + 1) % agent.world_size
                other = other if other != me else (other + 1) % agent.world_size
                mid += 1
                messages = [
                    [wire.pack_header(wire.Kind.CALL, mid, 0), msgpack.packb(["@barrier", [], {}, None])],
                    [wire.pack_header(wire.Kind.CALL, mid, other, {"autograd": [[other, mid], [], []]}),
                     msgpack.packb(["bench_remote:echo", [1], {}, None])],
                    [wire.pack_header(wire.Kind.SYSTEM, 0, other,
                                      {"@bk": [["rref.add", [[[other, mid], [other, mid]]]]]}),
                     msgpack.packb(["@bk", [], {}, None])],
                ]
                outsider = ctx.socket(zmq.DEALER)
                outsider.linger = 0
                outsider.connect(t.endpoints[v])
                for sock in (members[v], outsider):
                    for m in messages:
                        try:
                            sock.send_multipart(m, zmq.NOBLOCK)
                            out["sent"] += 1
                        except zmq.Again:  # no connection to queue it on (yet, or refused)
                            out["unsent"] += 1
                outsider.close()
            for s in members.values():
                while s.poll(0):
                    kind = wire.unpack_header(s.recv_multipart()[0])[0]
                    out["refused" if kind == wire.Kind.ERROR else "served"] += 1
            time.sleep(1.0 / rate)
        return out
    finally:
        ctx.destroy(linger=0)
