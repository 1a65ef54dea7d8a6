"""From recorded events to results: :class:`FunctionEvent` objects and a trace's parts.

What the recorders of a profile collected (this process's, and what its RPC peers sent:
``profiling.Recorder.finish`` makes both portable, in epoch nanoseconds) becomes one
:class:`Results`: an :class:`~distgrad.autograd.profiler_util.EventList` with its tree
built (PyTorch's post-processing), plus what a Chrome trace also shows: the processes
and threads, arrows between processes (an RPC's send and its serving), and arrows from
a forward op to the backward node it recorded (PyTorch's ``fwdbwd``).
"""
import bisect
import os
import socket

from . import profiling as P
from .profiler_util import EventList, FunctionEvent

__all__ = ["Results", "build", "local_process"]

_CATEGORIES = {P.OP: "cpu_op", P.EVAL: "cpu_op", P.NODE: "cpu_op", P.USER: "user_annotation",
               P.PY: "python_function", P.RPC: "rpc", P.HANDLER: "rpc"}
STEP_PREFIX = "ProfilerStep#"


class Results:
    """A finished profile: ``events`` (an EventList) and, for traces, ``processes``
    (``[{"pid", "name", "rank", "host", "threads": {native tid: name}}]``), ``flows``
    (``[(category, id, (pid, tid, ts_us) start, (pid, tid, ts_us) end)]``), ``base_ns``
    (epoch nanoseconds of time 0) and ``warnings`` (what could not be collected)."""

    def __init__(self, events, processes, flows, base_ns, warnings):
        self.events, self.processes, self.flows = events, processes, flows
        self.base_ns, self.warnings = base_ns, warnings


def local_process(rec):
    """This process as a trace names it (RPC's collector adds the worker's name and rank)."""
    ident = getattr(rec, "identity", None) or {}
    return {"pid": os.getpid(), "host": socket.gethostname(), "name": ident.get("name"),
            "rank": ident.get("rank"),
            "threads": {native: name for native, name in rec.threads.values()}}


def build(rec, use_device=None, profile_memory=False, with_flops=False):
    """The :class:`Results` of a stopped recorder and what its peers sent for it."""
    base_ns = rec.start_ns + rec.clock_offset
    batches = [(local_process(rec), rec.finish(), -1)]
    batches += [(proc, events, proc.get("rank", -2)) for proc, events in rec.remote]
    all_events, flow_ends, fwd_marks = [], {}, []
    for index, (proc, events, node_id) in enumerate(batches):
        small_ids = {}
        forward_threads = {}
        made = []
        for kind, name, start, end, tid, seq, extra in sorted(events, key=lambda e: e[2]):
            thread = small_ids.setdefault(tid, len(small_ids) + 1)
            t0, t1 = (start - base_ns) / 1e3, (end - base_ns) / 1e3
            if kind in (P.FLOW_OUT, P.FLOW_IN):
                flow_ends.setdefault(seq, [None, None])[kind == P.FLOW_IN] = \
                    (proc["pid"], tid, t0)
                continue
            event = _event(kind, name, t0, t1, thread, seq, extra, node_id, use_device)
            event.kind, event.trace_ids = kind, (proc["pid"], tid, _CATEGORIES[kind])
            if kind == P.OP and seq >= 0:
                forward_threads[seq] = thread
                fwd_marks.append((("fwdbwd", index, seq), event, True))
            elif kind == P.NODE and seq >= 0:
                fwd_marks.append((("fwdbwd", index, seq), event, False))
            made.append(event)
        for event in made:  # backward events: the thread of the op that made their node
            backward = event.scope == 1 or event.kind == P.EVAL
            event.fwd_thread = forward_threads.get(event.sequence_nr, event.thread) \
                if backward and event.sequence_nr >= 0 else 0
        _mark_async_rpcs(made)
        all_events += made
    all_events.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    for i, event in enumerate(all_events):
        event.id = i + 1
    events = EventList(all_events, use_device=use_device, profile_memory=profile_memory,
                       with_flops=with_flops)
    events._build_tree()
    flows = [("rpc", fid, a, b) for fid, (a, b) in flow_ends.items()
             if a is not None and b is not None]
    flows += _forward_backward_flows(fwd_marks)
    processes = [proc for proc, _, _ in batches]
    return Results(events, processes, flows, base_ns, list(rec.warnings))


def _event(kind, name, t0, t1, thread, seq, extra, node_id, use_device):
    extra = extra if type(extra) is dict else {}
    trace_name = name
    if kind == P.USER and name.startswith(STEP_PREFIX):
        name = "ProfilerStep*"  # the steps of a schedule are one row of the table
    event = FunctionEvent(
        id=0, name=name, trace_name=trace_name, thread=thread, start_us=t0, end_us=t1,
        input_shapes=extra.get("shapes", []), concrete_inputs=extra.get("concrete", []),
        input_dtypes=extra.get("types", []), scope=1 if kind == P.NODE else 0,
        use_device=use_device, cpu_memory_usage=extra.get("mem", 0),
        is_async="end_tid" in extra, is_remote=node_id != -1,
        sequence_nr=seq if kind in (P.OP, P.EVAL, P.NODE) else -1, node_id=node_id,
        flops=extra.get("flops", 0), is_user_annotation=kind == P.USER,
        is_python_function=kind == P.PY)
    if kind == P.PY:
        event.python_id, event.python_parent_id = seq, extra.get("parent", 0)
    elif kind == P.RPC:
        event.flow_id = seq
    return event


def _mark_async_rpcs(events):
    """An RPC's caller-side event is a slice of its thread when the thread did nothing
    else until the reply (``rpc_sync``); otherwise (``rpc_async``, the thread ran on) it
    is async, as an event that ends on another thread is in PyTorch. Python function
    events (``with_stack``) do not count: sending and waiting are Python calls that
    begin before the send or end after the reply."""
    by_thread = {}
    for e in events:
        if not e.is_async:
            by_thread.setdefault(e.thread, []).append(e)
    for thread_events in by_thread.values():
        if not any(e.kind == P.RPC for e in thread_events):
            continue
        thread_events = sorted((e for e in thread_events if e.kind != P.PY),
                               key=lambda e: (e.time_range.start, -e.time_range.end))
        work = [e.time_range.start for e in thread_events]
        open_events = []
        for e in thread_events:
            while open_events and open_events[-1].time_range.end <= e.time_range.start:
                open_events.pop()
            if e.kind == P.RPC:
                first = bisect.bisect_right(work, e.time_range.start)
                inside = first < len(work) and work[first] < e.time_range.end
                crossing = open_events and open_events[-1].time_range.end < e.time_range.end
                if inside or crossing:
                    e.is_async = True
                    continue
            open_events.append(e)


def _forward_backward_flows(marks):
    """PyTorch's ``fwdbwd`` arrows: from the op that recorded a node to the node's run."""
    starts, out = {}, []
    for key, event, is_forward in marks:
        if is_forward:
            starts[key] = event
    for i, (key, event, is_forward) in enumerate(marks):
        fwd = None if is_forward else starts.get(key)
        if fwd is not None:
            pid, tid, _ = fwd.trace_ids
            bpid, btid, _ = event.trace_ids
            out.append(("fwdbwd", i + 1, (pid, tid, fwd.time_range.start),
                        (bpid, btid, event.time_range.start)))
    return out
