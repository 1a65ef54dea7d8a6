"""Sets of CPU cores: the ``0-3,6`` notation of taskset and cpusets, and pinning to them.

A process that sleeps between short bursts of work (a pipeline stage waiting for its
neighbour) comes back to caches and branch predictors that whatever ran meanwhile
has filled, and, when the scheduler moved it, to another core's: on a 2-core machine
a stage's forward pass of a small model took 1.7-2x the CPU time it takes in a tight
loop. Pinning each worker to cores of its own keeps what it left behind where it
resumes (the idea of PyTorch's ``torch.backends.xeon.run_cpu`` launcher, which binds
every instance to its cores).

>>> parse_cpus("0-2,5")
[0, 1, 2, 5]
>>> format_cpus([0, 1, 2, 5, 7, 8])
'0-2,5,7-8'
>>> allocate_cpus(3, 1, [0, 1])
[[0], [1], [0]]
"""
import os

__all__ = ["parse_cpus", "format_cpus", "allowed_cpus", "allocate_cpus", "pin_to"]


def parse_cpus(text):
    """The sorted cores of a list like ``"0-3,6"``; ValueError naming what is wrong."""
    cores = set()
    for part in str(text).split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"{text!r} is not a list of cores like '0-3,6' "
                             f"(at {part!r})") from None
        if first < 0 or last < first:
            raise ValueError(f"{text!r}: {part!r} is not a range of cores")
        cores.update(range(first, last + 1))
    return sorted(cores)


def format_cpus(cores):
    """``cores`` in the notation :func:`parse_cpus` reads, ranges joined."""
    cores, runs = sorted(set(cores)), []
    for c in cores:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def allowed_cpus():
    """The cores this process may run on (its affinity: a Slurm or container cpuset)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def allocate_cpus(count, per_process, cores):
    """Cores for ``count`` processes of ``per_process`` cores each, in order from
    ``cores``: neighbours get neighbouring cores, and once every core has one process,
    the next ones start over from the first (more processes than cores share them)."""
    n = len(cores)
    return [[cores[(i * per_process + j) % n] for j in range(min(per_process, n))]
            for i in range(count)]


def pin_to(cores, who="this process"):
    """Run this process (and the threads it starts from now on) on ``cores`` only."""
    allowed = allowed_cpus()
    missing = sorted(set(cores) - set(allowed))
    if missing:
        raise ValueError(f"{who} cannot run on core(s) {format_cpus(missing)}: it may use "
                         f"{format_cpus(allowed)}")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
