"""A profile as a Chrome trace in Kineto's layout (what ``torch.profiler`` writes).

A JSON object with ``schemaVersion``, ``deviceProperties``, ``trace_id``, the profile's
metadata, ``traceEvents``, ``displayTimeUnit`` and ``baseTimeNanoseconds``; one process
per OS process that recorded (with RPC, the callees too: named after their worker),
its threads, a complete (``X``) event per op, backward node, ``record_function`` block,
Python function and RPC, async (``b``/``e``) events for what ended on another thread,
and flow arrows (``s``/``f``): ``fwdbwd`` from a forward op to its backward node, ``rpc``
from where a message was sent to where it was served. Chrome's ``about:tracing``,
Perfetto and TensorBoard's profiler plugin read it.
"""
import gzip
import json
import socket

__all__ = ["write"]

_SECOND = 10 ** 9


def _args(event, index):
    args = {"External id": event.id, "Record function id": 0}
    if event.sequence_nr >= 0:
        args["Sequence number"] = event.sequence_nr
        args["Fwd thread id"] = event.fwd_thread if event.fwd_thread is not None else 0
    if event.input_shapes:
        args["Input Dims"] = event.input_shapes
        args["Input type"] = event.input_dtypes
        args["Concrete Inputs"] = event.concrete_inputs
    if event.is_python_function:
        args = {"Python parent id": event.python_parent_id or None, "Python id": event.python_id}
    if event.cpu_memory_usage:
        args["CPU Mem"] = event.cpu_memory_usage
    if event.flops:
        args["flops"] = event.flops
    if event.node_id != -1:
        args["Node ID"] = event.node_id
    args["Ev Idx"] = index
    return args


def _metadata_events(processes, ts):
    out = []
    for proc in processes:
        pid = proc["pid"]
        label = proc["name"] or "python"
        if proc.get("rank") is not None:
            label = f"{label} (rank {proc['rank']})"
        out += [{"ph": "M", "name": "process_name", "ts": ts, "pid": pid, "tid": 0,
                 "args": {"name": label}},
                {"ph": "M", "name": "process_labels", "ts": ts, "pid": pid, "tid": 0,
                 "args": {"labels": f"CPU, {proc['host']}"}},
                {"ph": "M", "name": "process_sort_index", "ts": ts, "pid": pid, "tid": 0,
                 "args": {"sort_index": proc.get("rank") or 0}}]
        for tid, name in sorted(proc["threads"].items()):
            out += [{"ph": "M", "name": "thread_name", "ts": ts, "pid": pid, "tid": tid,
                     "args": {"name": f"thread {tid} ({name})"}},
                    {"ph": "M", "name": "thread_sort_index", "ts": ts, "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}}]
    return out


def write(results, path, trace_id, metadata):
    """Write ``results`` (:class:`~distgrad.autograd.profiler_results.Results`) to ``path``
    (gzip-compressed when it ends in ``.gz``); ``metadata`` maps keys to JSON texts."""
    # timestamps count from a whole second a minute before the profile began, so that a
    # peer whose clock is a little behind still gets positive times
    base = (results.base_ns // _SECOND - 60) * _SECOND
    shift = (results.base_ns - base) / 1e3
    events = results.events
    first = min((e.time_range.start for e in events), default=0.0) + shift
    last = max((e.time_range.end for e in events), default=0.0) + shift
    trace = _metadata_events(results.processes, round(first, 3))
    for index, e in enumerate(events):
        if e.trace_ids is None:
            continue
        pid, tid, cat = e.trace_ids
        ts, dur = round(e.time_range.start + shift, 3), round(e.time_range.elapsed_us(), 3)
        if e.is_async:  # an RPC awaited while its thread went on, or a block ended elsewhere
            common = {"cat": cat, "name": e.trace_name, "pid": pid, "tid": tid,
                      "id": e.flow_id if e.flow_id is not None else e.id}
            trace.append({"ph": "b", "ts": ts, "args": _args(e, index), **common})
            trace.append({"ph": "e", "ts": round(ts + dur, 3), **common})
            continue
        trace.append({"ph": "X", "cat": cat, "name": e.trace_name, "pid": pid, "tid": tid,
                      "ts": ts, "dur": dur, "args": _args(e, index)})
    for cat, fid, (spid, stid, sts), (fpid, ftid, fts) in results.flows:
        trace.append({"ph": "s", "id": fid, "pid": spid, "tid": stid, "ts": round(sts + shift, 3),
                      "cat": cat, "name": cat})
        trace.append({"ph": "f", "id": fid, "pid": fpid, "tid": ftid, "ts": round(fts + shift, 3),
                      "cat": cat, "name": cat, "bp": "e"})
    trace += [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
               "tid": "PyTorch Profiler", "ts": round(first, 3), "dur": round(last - first, 3),
               "args": {"Op count": 0}},
              {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "",
               "ts": round(last, 3)}]
    doc = {"schemaVersion": 1, "deviceProperties": [], "trace_id": trace_id,
           "host_name": socket.gethostname()}
    for key, text in metadata.items():
        doc[key] = json.loads(text)
    doc.update(traceEvents=trace, traceName=path, displayTimeUnit="ms", baseTimeNanoseconds=base)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f)
