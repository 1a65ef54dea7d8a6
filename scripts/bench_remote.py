"""Functions the benchmarks run on their worker processes (allowed there by name)."""
import numpy as np


def echo(x):
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
