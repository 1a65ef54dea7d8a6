"""``with_stack=True``: the Python functions a profiled thread runs, as events.

PyTorch 2.x answers ``with_stack`` with its Python tracer: every Python function and
built-in called while profiling becomes a ``python_function`` event named
``path(line): function`` (the path relative to its ``sys.path`` entry) or the built-in's
``repr``, nested by time around the ops. Here the same comes from ``sys.setprofile`` on
the recording thread. distgrad's ops are Python, so their insides show too; the op
wrappers of the profiler itself are left out. It costs a Python call per traced call.
"""
import os
import sys
from time import perf_counter_ns

__all__ = ["start", "stop", "event_name"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# Files whose frames are the profiler's own machinery (the op wrappers), not the program's.
_SKIPPED = frozenset(os.path.join(_HERE, f) for f in ("profiling.py", "profiler_inputs.py"))


class _Tracer:
    """The profile function of one thread: a stack of open calls."""

    __slots__ = ("rec", "tid", "kind", "stack", "next_id", "prev")

    def __init__(self, rec, tid, kind, prev):
        self.rec, self.tid, self.kind, self.prev = rec, tid, kind, prev
        self.stack = []      # [(python id, start ns, raw name) or None for a skipped frame]
        self.next_id = 1

    def __call__(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename in _SKIPPED:
                self.stack.append(None)
            else:
                self._push((code, frame.f_lineno))
        elif event == "c_call":
            self._push(arg)
        elif self.stack:  # return, c_return, c_exception
            top = self.stack.pop()
            if top is not None:
                self._record(top)

    def _push(self, raw):
        self.stack.append((self.next_id, perf_counter_ns(), raw))
        self.next_id += 1

    def _record(self, top, end=None):
        pyid, start, raw = top
        parent = next((s[0] for s in reversed(self.stack) if s is not None), 0)
        self.rec.events.append((self.kind, raw, start, end or perf_counter_ns(), self.tid, pyid,
                                parent))


def start(rec, tid, kind):
    """Trace this thread's (native id ``tid``) Python calls into ``rec`` as events of
    ``kind``; frames already running count from now."""
    tracer = _Tracer(rec, tid, kind, sys.getprofile())
    frames = []
    f = sys._getframe(2)
    while f is not None:
        frames.append(f)
        f = f.f_back
    for f in reversed(frames):
        if f.f_code.co_filename in _SKIPPED:
            tracer.stack.append(None)
        else:
            tracer._push((f.f_code, f.f_lineno))
    sys.setprofile(tracer)
    return tracer


def stop(tracer):
    """Stop tracing; calls still open end now."""
    sys.setprofile(tracer.prev)
    end = perf_counter_ns()
    while tracer.stack:
        top = tracer.stack.pop()
        if top is not None:
            tracer._record(top, end)


_short_cache = {}


def _short(path):
    """``path`` relative to the longest ``sys.path`` entry it is under (PyTorch's names)."""
    out = _short_cache.get(path)
    if out is None:
        best = ""
        for entry in sys.path:
            entry = os.path.abspath(entry or ".")
            if path.startswith(entry + os.sep) and len(entry) > len(best):
                best = entry
        out = _short_cache[path] = path[len(best) + 1:] if best else path
    return out


def event_name(raw):
    """The name of a Python event: ``path(line): function``, or a built-in's repr."""
    if type(raw) is tuple:
        code, line = raw
        return f"{_short(code.co_filename)}({line}): {code.co_name}"
    return repr(raw)
