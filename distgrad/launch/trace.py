"""Traces of a launch: events recorded in each process, merged into one Chrome trace.

Each process keeps a :class:`Recorder` (a no-op unless ``--trace`` is given):
spans (forward and backward of a micro-batch, optimizer steps, a step on the
coordinator, a stage's offloaded activations written and read back) and the two ends of every message between processes (an activation
or gradient leaving one stage, arriving at the next). The coordinator gathers the
events at the end, measures each process's clock offset, and writes one JSON file
that Perfetto and chrome://tracing open: a lane per process and per thread role,
and flow arrows from each send to its receipt.

Clock alignment: for every process the coordinator takes a few (t0, remote clock,
t2) round trips and keeps the one with the shortest round trip, which puts the
offset within half of it. Every message then adds a constraint (its receipt is
after its send); offsets are lowered until all hold (Bellman-Ford on difference
constraints), so arrows never point back in time.
"""
import json
import time
from contextlib import contextmanager

__all__ = ["Recorder", "flow_id", "grad_flow_id", "offset_from_samples", "align", "chrome_trace",
           "write_chrome_trace"]

#: lanes (thread ids) of a process in the trace
LANES = {"compute": 0, "messages": 1, "steps": 2, "offload I/O": 3}

_FLOW_KINDS = {"input": 0, "target": 1, "act": 2, "grad": 3, "result": 4}


def flow_id(kind, step, micro_batch, stage):
    """One integer per message, computed alike by its sender and its receiver."""
    return ((step * 4096 + micro_batch) * 1024 + stage) * 8 + _FLOW_KINDS[kind]


def grad_flow_id(step, micro_batch, stage, backward_pass=0):
    """The gradient of stage ``stage``'s output in the autograd strategy, on its way to
    it from the next stage (or the coordinator); in the first or (``backward_pass`` 1:
    an auxiliary loss's) the second backward of a step."""
    return flow_id("grad", step, micro_batch, stage) + backward_pass * _PASS_SHIFT


# stages use the low 9 bits of flow_id's 10-bit stage field (at most 256 workers)
_PASS_SHIFT = flow_id("grad", 0, 0, 512) - flow_id("grad", 0, 0, 0)


class Recorder:
    """Events of one process; timestamps in nanoseconds of ``time.perf_counter_ns``."""

    def __init__(self, enabled=False):
        self.enabled = enabled
        self.events = []

    now = staticmethod(time.perf_counter_ns)

    @contextmanager
    def span(self, name, lane="compute", **args):
        if not self.enabled:
            yield
            return
        start, cpu = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            # the thread's CPU time beside the wall time: a span much longer than its CPU
            # time waited (for the GIL, for a core, for I/O), not computed
            args["cpu_ms"] = (time.thread_time_ns() - cpu) / 1e6
            self.events.append(("X", name, lane, start, time.perf_counter_ns(), args, None))

    def add_span(self, name, start, end, lane="compute", **args):
        if self.enabled:
            self.events.append(("X", name, lane, start, end, args, None))

    def message(self, end, name, ident, lane="messages", at=None):
        """One end of a message: ``end`` is "send" or "receive"."""
        if self.enabled:
            t = time.perf_counter_ns() if at is None else at
            self.events.append(("s" if end == "send" else "f", name, lane, t, t, {}, ident))

    def on_gradient(self, tensor, *ends):
        """Record message ends ``(end, name, ident)`` when ``tensor``'s gradient is
        computed (a send or receipt of it that no span of ours sees: inside a backward).
        A second backward over the same graph (retain_graph) records its ends as the
        ``ident`` of :func:`grad_flow_id`'s ``backward_pass=1``."""
        if not self.enabled or not tensor.requires_grad:
            return
        passes = [0]

        def hook(_grad):
            shift = passes[0] * _PASS_SHIFT
            passes[0] += 1
            for end, name, ident in ends:
                self.message(end, name, ident + shift)
        tensor.register_hook(hook)

    def take(self):
        events, self.events = self.events, []
        return events


def offset_from_samples(samples):
    """(offset, uncertainty) in ns from (t0, remote, t2) round trips: remote - local."""
    t0, remote, t2 = min(samples, key=lambda s: s[2] - s[0])
    return remote - (t0 + t2) // 2, (t2 - t0) // 2


def align(offsets, events_by_process, margin_ns=1000):
    """Lower the offsets until every receipt is at least ``margin_ns`` after its send.

    ``offsets``: {process: ns}; local time minus offset is the common time.
    """
    sends, receipts = {}, {}
    for proc, events in events_by_process.items():
        for ph, _name, _lane, t, _end, _args, ident in events:
            if ph == "s":
                sends[ident] = (proc, t)
            elif ph == "f":
                receipts[ident] = (proc, t)
    # receipt - off[dst] >= send - off[src] + margin
    #   <=>  off[dst] <= off[src] + (receipt - send - margin)
    edges = [(src, dst, rt - st - margin_ns) for ident, (dst, rt) in receipts.items()
             if ident in sends for src, st in [sends[ident]] if src != dst]
    offsets = dict(offsets)
    for _ in range(len(offsets)):
        changed = False
        for src, dst, gap in edges:
            bound = offsets[src] + gap
            if offsets[dst] > bound:
                offsets[dst] = bound
                changed = True
        if not changed:
            break
    return offsets


def chrome_trace(processes):
    """The trace dict. ``processes``: [{"pid", "name", "offset", "events"}, ...]."""
    base = min((e[3] - p["offset"] for p in processes for e in p["events"]), default=0)
    out = []
    for p in processes:
        pid, off = p["pid"], p["offset"]
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": p["name"]}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
        for lane, tid in LANES.items():
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                        "args": {"name": lane}})
        for ph, name, lane, start, end, args, ident in p["events"]:
            ts = (start - off - base) / 1000.0
            event = {"ph": ph, "name": name, "pid": pid, "tid": LANES[lane], "ts": ts}
            if ph == "X":
                event["dur"] = max((end - start) / 1000.0, 0.001)
                event["args"] = args
            else:
                # a flow end binds to the slice around it: give each end a short slice
                out.append({"ph": "X", "name": f"{'send' if ph == 's' else 'receive'} {name}",
                            "pid": pid, "tid": LANES[lane], "ts": ts, "dur": 1.0,
                            "cat": "message"})
                event.update(id=ident, cat="message")
                if ph == "f":
                    event["bp"] = "e"
            out.append(event)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(path, processes):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(chrome_trace(processes), fh)
