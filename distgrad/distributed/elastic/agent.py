"""The torchrun agent's loop, for one node or many: meet the other nodes' agents (a round
of the rendezvous), start this node's workers, watch them and the round, stop them when
either ends, then start again or report.

What ends a round comes from the rendezvous (``rendezvous/handler.py``; one node:
``rendezvous/local.py``): this node's workers failed, another node's did, a node was
lost, nodes wait to join, or every node's workers succeeded. A failure past
``--max-restarts`` is raised as :class:`ChildFailedError` on every node, with the
failure that ended the world first (the same on every node) and this node's own.
"""
import os
import signal
import sys
import time

from ..errors import DistNetworkError
from .rendezvous.api import RendezvousClosedError, RendezvousConnectionError
from .rendezvous.handler import Ended
from .workers import ChildFailedError, SignalException, WorkerGroup

__all__ = ["run_agent"]


def run_agent(args, rendezvous, nproc, error_dir, secret, grace):
    """Run this node's part of the launch of ``args`` to its end; ``rendezvous`` is left
    (shut down) at the end, whatever happens."""
    group, reachable = None, True
    try:
        while True:
            rnd = rendezvous.next_rendezvous()
            master = rnd.master()
            local = []
            if isinstance(master, Ended):
                ended = master
            else:
                group = WorkerGroup(args, nproc, rnd, master, error_dir, secret,
                                    rendezvous.host)
                local, ended = _watch(group, rnd, args.monitor_interval)
                group.stop(signal.SIGTERM, grace)
                group = None
                if ended is None:
                    return
            if ended.final:
                raise _final_error(os.path.basename(args.training_script), local, ended)
            _log_restart(args, rnd, ended)
    except SignalException as e:
        if group is not None:
            group.stop(e.sigval, grace)
        rendezvous.interrupted(e.sigval)
        raise
    except DistNetworkError as e:
        reachable = False
        if group is not None:
            group.stop(signal.SIGTERM, grace)
            group = None
        raise RendezvousConnectionError(
            f"the agents' store at {rendezvous.where()} stopped answering: the host or the "
            f"agent that serves it is gone ({e})") from None
    except BaseException:
        if group is not None:
            group.stop(signal.SIGTERM, grace)
        raise
    finally:
        rendezvous.shutdown(reachable)


def _watch(group, rnd, interval):
    """(this node's failures, how the round ended: None when every node succeeded)."""
    while True:
        done, failures = group.poll()
        if failures:
            return failures, rnd.fail(failures)
        if done:
            return [], rnd.finished()
        ended = rnd.check()
        if ended is not None:
            return [], ended
        time.sleep(interval)


def _final_error(name, local, ended):
    seen = {(f.host, f.rank) for f in ended.failures}
    failures = ended.failures + [f for f in local if (f.host, f.rank) not in seen]
    if failures:
        return ChildFailedError(name, failures)
    return RendezvousClosedError(ended.text)


_CAUSES = {"failed": "worker group FAILED", "lost": "a node was lost",
           "interrupted": "an agent was stopped by a signal"}


def _log_restart(args, rnd, ended):
    if ended.why == "membership":
        what = f"{ended.text}; restarting the worker group (no restart is counted)"
    else:
        left = args.max_restarts - rnd.restarts
        cause = _CAUSES.get(ended.why, "the round ended")
        what = (f"{cause} ({ended.text}); {left}/{args.max_restarts} attempts left, "
                "restarting the worker group")
    print(f"distgrad.distributed.run: [{args.role}] {what}", file=sys.stderr, flush=True)
