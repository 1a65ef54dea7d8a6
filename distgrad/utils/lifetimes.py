"""Threads have owners that wait for them (Trio's rule: no task outlives its nursery).

An owner that stops joins what it started; a thread that cannot be joined in time is
reported by name and by where it is stuck, not left behind in silence. Used by every
owner of a thread: the RPC transport, handler pools and meeting points, the offload
tiers, stores and read-ahead.
"""
import logging
import sys
import threading
import time
import traceback

__all__ = ["join_all"]

log = logging.getLogger("distgrad")


def join_all(threads, timeout, owner):
    """Join ``threads`` within ``timeout`` seconds in all (the calling thread itself is
    skipped); log each one still running with its stack, naming ``owner``; return them."""
    deadline = time.monotonic() + timeout
    me = threading.current_thread()
    stuck = []
    for t in threads:
        if t is me or t.ident is None:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            stuck.append(t)
    if stuck:
        frames = sys._current_frames()
        for t in stuck:
            frame = frames.get(t.ident)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)\n"
            log.warning("%s: thread %r did not stop within %.1f s; it is at:\n%s", owner,
                        t.name, timeout, stack.rstrip())
    return stuck
