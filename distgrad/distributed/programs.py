"""Collective programs: how a collective runs on this rank, and how ranks that called
different collectives find out.

* a collective is a *program*: a generator (``algorithms.py``) that sends
  messages and ``yield``\\ s what it waits for, ``(peer, step)``. Programs
  submitted from any thread (``Communicator.submit``) start on the communicator's
  I/O thread; a message that arrives resumes the program waiting for it, or waits
  in the stash until its program asks. So there is no thread hop per message, only
  one to start a collective and one to report its end (the caller waits on its
  :class:`Work`).
* a message of a collective carries ``[COLL, group, seq, step, fingerprint]``;
  ``seq`` numbers the collectives of a group, the fingerprint says what the
  sender called (op, shapes, dtypes, root, reduction). Each rank checks the
  fingerprint of every message of a collective it runs against its own; and
  every program hears from its left neighbour in the group before it ends (the
  algorithms' own messages, or an explicit one), so if ranks called different
  collectives, some rank sees it. That rank tells every member (MISMATCH, with
  what it called); each member answers with what it called, and every rank
  fails with the whole table. Nothing waits for a timeout.
* a program that raises, or outlives its group's timeout, breaks its group
  (``Communicator.break_group``): every member is told, since half-finished
  collectives leave ranks out of step.

Everything here runs on the communicator's I/O thread, which owns this state; other
threads reach it only through the communicator's submission queue.
"""
import logging
import time

import numpy as np

from .errors import DistBackendError
from .messages import COLL, MISMATCH

__all__ = ["Program", "ProgramRunner", "describe_fingerprint", "shm_handshake"]

log = logging.getLogger("distgrad.distributed")

_MISMATCH_GRACE = 10.0      # how long to wait for every member's answer after a mismatch


def describe_fingerprint(fp):
    """``all_reduce(shape=[4], dtype=float32, op=SUM)`` for a fingerprint."""
    if fp is None:
        return "nothing"
    name, shapes, dtypes, params = fp
    parts = []
    if len(shapes) == 1:
        parts.append(f"shape={shapes[0]}")
    elif shapes:
        parts.append(f"shapes={shapes}")
    if dtypes:
        parts.append(f"dtype={dtypes[0]}" if len(set(dtypes)) == 1 else f"dtypes={dtypes}")
    parts += [f"{k}={v}" for k, v in params]
    return f"{name}({', '.join(parts)})"


def _valid_fp(fp):
    return (type(fp) is list and len(fp) == 4 and type(fp[0]) is str
            and type(fp[1]) is list and type(fp[2]) is list and type(fp[3]) is list)


class Program:
    """One collective on this rank: its generator and what it waits for.

    Algorithms see it as their context: ``rank``/``size`` in the group,
    ``send(peer, step, payload)``, and ``yield prog.recv(peer, step)`` (peers are group
    ranks). ``heard`` holds the group ranks a message of this collective came from.
    """

    __slots__ = ("runner", "group", "seq", "fp", "body", "gen", "work", "deadline", "waiting",
                 "heard", "needs_left", "rank", "size", "on_done")

    def __init__(self, runner, group, fp, body, work, needs_left, on_done=None):
        self.runner, self.group, self.fp, self.body, self.work = runner, group, fp, body, work
        self.rank, self.size = group.rank, len(group.ranks)
        # the algorithm may end without a message from its left neighbour (or its first
        # message may not go to its right one): the runner adds both (step -1)
        self.needs_left = needs_left
        self.on_done = on_done        # runs on success before the work completes (copy back)
        self.seq = self.gen = self.waiting = None
        self.deadline = float("inf")
        self.heard = set()

    def send(self, peer, step, payload):
        self.runner.send(self, peer, step, payload)

    def recv(self, peer, step):
        return (peer, step)

    def describe(self):
        return f"{self.fp[0]} (collective #{self.seq} of {self.group.describe()})"

    # as an entry of the communicator's deadlines
    def done(self):
        return self.gen is None and self.seq is not None

    def expire(self):
        self.runner.expire(self)


class _Mismatch:
    """A group's answers to a mismatch at collective ``seq``, collected until ``deadline``."""

    __slots__ = ("seq", "called", "deadline")

    def __init__(self, seq, deadline):
        self.seq, self.deadline = seq, deadline
        self.called = {}  # rank -> fingerprint of what it called at seq (None: nothing)


class ProgramRunner:
    """The running collectives of every group of one communicator: starts them, feeds
    them the messages they wait for, ends them, and runs the MISMATCH protocol.

    It is handed its communicator (``comm.py`` imports this module, not the other way
    round) and uses it to send, to count kept messages against their sender's
    backlog, to register deadlines and to break groups.
    """

    def __init__(self, comm):
        self.comm = comm
        self._waiting = {}  # (gid, seq, step, src) -> the Program waiting for that message
        self._stash = {}    # (gid, seq, step, src) -> (fingerprint, payload) not asked for yet

    # ------------------------------------------------------------------ running
    def start(self, prog):
        group = prog.group
        if group.broken is not None:
            prog.work._finish(group.broken, self.comm.callbacks)
            return
        group.started = max(group.started, prog.seq)
        group.running[prog.seq] = prog
        group.last_fp[prog.seq] = prog.fp
        if len(group.last_fp) > 8:
            del group.last_fp[min(group.last_fp)]
        prog.gen = prog.body(prog)
        self.comm.deadlines.add(prog.deadline, prog)
        if prog.needs_left and prog.size > 1:
            # tell the right neighbour what this rank runs (the algorithm may not)
            self.comm.send_message(group.ranks[(prog.rank + 1) % prog.size],
                                   [COLL, group.gid, prog.seq, -1, prog.fp], None)
        mismatch = group.mismatch
        if mismatch is not None and prog.seq >= mismatch.seq:
            # ranks disagree: this collective waits for the verdict instead of running
            if prog.seq == mismatch.seq and self.comm.rank not in mismatch.called:
                self._answer_mismatch(group, prog.fp)
                self.on_mismatch(group, prog.seq, {})
            return
        # messages that came before this collective started: check what their senders called
        for key in self._stashed_keys(group, prog.seq):
            if not self._check_fp(prog, key[3], self._stash[key][0]):
                return
        self._advance(prog, None)

    def _advance(self, prog, value):
        """Run ``prog`` until it waits for a message that is not here yet, or ends."""
        with np.errstate(all="ignore"):  # reductions overflow as PyTorch's do: silently
            self._step(prog, value)

    def _step(self, prog, value):
        group = prog.group
        try:
            while True:
                peer, step = prog.gen.send(value)
                src = group.ranks[peer]
                key = (group.gid, prog.seq, step, src)
                got = self._stash.pop(key, None)
                if got is None:
                    if src in group.gone:  # it left without sending this
                        self.comm.break_group(group, group.gone[src], tell=False,
                                              keep_received=True)
                        return
                    self._waiting[key] = prog
                    prog.waiting = key
                    return
                self.comm.backlog.taken(src)
                value = got[1]
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 - the collective fails, and with it the group
            log.debug("collective %s failed", prog.describe(), exc_info=True)
            err = e if isinstance(e, DistBackendError) else DistBackendError(
                f"{prog.describe()} failed on rank {self.comm.rank}: {type(e).__name__}: {e}")
            err.__cause__ = e
            self.comm.break_group(group, err, tell=True, seq=prog.seq)
            return
        if prog.needs_left and prog.size > 1 and group.ranks[(prog.rank - 1) % prog.size] \
                not in prog.heard:
            # hear from the left neighbour before ending (see the module doc): wait for the
            # fingerprint it sent when it started
            prog.gen = _wait_for_left(prog)
            self._step(prog, None)
            return
        self._finish(prog)

    def _finish(self, prog, exc=None):
        group = prog.group
        prog.gen = None
        if prog.waiting is not None:
            self._waiting.pop(prog.waiting, None)
            prog.waiting = None
        group.running.pop(prog.seq, None)
        self._drop_stashed(self._stashed_keys(group, prog.seq))  # fingerprints nobody waited for
        if exc is None and prog.on_done is not None:
            try:
                prog.on_done()
            except Exception as e:  # noqa: BLE001 - reported to the caller
                exc = e
        prog.work._finish(exc, self.comm.callbacks)

    def _stashed_keys(self, group, seq=None):
        """Keys of the stashed messages of ``group`` (of its collective ``seq`` only)."""
        return [k for k in self._stash if k[0] == group.gid and (seq is None or k[1] == seq)]

    def _drop_stashed(self, keys):
        for key in keys:
            self.comm.backlog.taken(key[3])
            del self._stash[key]

    # ------------------------------------------------------------------ messages
    def send(self, prog, peer, step, payload):
        dst = prog.group.ranks[peer]
        if dst == self.comm.rank:
            raise RuntimeError("a collective program sent a message to its own rank")
        self.comm.send_message(dst, [COLL, prog.group.gid, prog.seq, step, prog.fp], payload)

    def on_message(self, group, src, seq, step, fp, payload):
        """A COLL message: resume the program waiting for it, or stash it."""
        key = (group.gid, seq, step, src)
        prog = group.running.get(seq)
        if prog is None and seq <= group.started:
            return  # the collective ended (or failed) here: a late message
        if prog is not None and not self._check_fp(prog, src, fp):
            return
        waiter = self._waiting.pop(key, None)
        if waiter is not None:
            waiter.waiting = None
            self._advance(waiter, payload)
            return
        if not self.comm.backlog.keep(src):
            self.comm.break_group(group, DistBackendError(
                f"rank {src} sent more than {self.comm.backlog.limit} messages that no "
                "collective here asked for"), tell=True)
            return
        self._stash[key] = (fp, payload)

    def _check_fp(self, prog, src, fp):
        prog.heard.add(src)
        if fp == prog.fp:
            return True
        self.on_mismatch(prog.group, prog.seq, {src: fp})
        return False

    # ------------------------------------------------------------------ mismatches
    def on_mismatch(self, group, seq, reports):
        """Ranks called different collectives at ``seq``: collect what every member called,
        then fail every rank's collective with the whole table. A rank that has not
        reached ``seq`` yet answers when it does (or, after the grace period, that it
        has not called it)."""
        if group.mismatch is None:
            if group.broken is not None:
                return
            grace = min(group.timeout, _MISMATCH_GRACE)
            group.mismatch = _Mismatch(seq, time.monotonic() + grace)
            if seq <= group.started:
                self._answer_mismatch(group, group.last_fp.get(seq))
        elif seq != group.mismatch.seq:
            return
        for r, fp in reports.items():
            if fp is None or _valid_fp(fp):
                group.mismatch.called[r] = fp
        if len(group.mismatch.called) == len(group.ranks):
            self._conclude_mismatch(group)

    def _answer_mismatch(self, group, mine):
        """Tell every member what this rank called at the mismatched collective."""
        group.mismatch.called[self.comm.rank] = mine
        self.comm.tell_members(group, [MISMATCH, group.gid, group.mismatch.seq, 0, mine])

    def _conclude_mismatch(self, group):
        seq, called = group.mismatch.seq, group.mismatch.called
        group.mismatch = None
        lines = []
        for r in group.ranks:
            if r not in called:
                lines.append(f"rank {r} did not answer")
            elif called[r] is None:
                lines.append(f"rank {r} did not call collective #{seq} within "
                             f"{min(group.timeout, _MISMATCH_GRACE):g} s")
            else:
                lines.append(f"rank {r} called {describe_fingerprint(called[r])}")
        err = DistBackendError(f"Detected mismatch between collectives on ranks of "
                               f"{group.describe()} at collective #{seq}: " + "; ".join(lines))
        self.comm.break_group(group, err, tell=False)

    def next_deadline(self):
        """When the soonest mismatch stops waiting for answers."""
        return min((g.mismatch.deadline for g in self.comm.groups.values()
                    if g.mismatch is not None), default=float("inf"))

    def on_tick(self, now):
        """Mismatches whose grace period is over conclude with the answers they have."""
        for group in list(self.comm.groups.values()):
            if group.mismatch is not None and now >= group.mismatch.deadline:
                if self.comm.rank not in group.mismatch.called:
                    self._answer_mismatch(group, None)
                self._conclude_mismatch(group)

    # ------------------------------------------------------------------ failures
    def expire(self, prog):
        group = prog.group
        waiting = ""
        if prog.waiting is not None:
            waiting = f" waiting for rank {prog.waiting[3]}"
        self.comm.break_group(group, DistBackendError(
            f"{prog.describe()} timed out after {group.timeout:g} s{waiting} on rank "
            f"{self.comm.rank}"), tell=True, seq=prog.seq)

    def waits_for(self, group, rank):
        """Whether a running collective of ``group`` waits for a message from ``rank``."""
        return any(prog.waiting is not None and prog.waiting[3] == rank
                   for prog in group.running.values())

    def fail_group(self, group, err):
        """``group`` is broken: its collectives fail with ``err``, its stash goes."""
        group.mismatch = None
        for prog in list(group.running.values()):
            self._finish(prog, err)
        self._drop_stashed(self._stashed_keys(group))


def _wait_for_left(prog):
    """The tail of a program that has not heard from its left neighbour yet: wait for the
    fingerprint message it sent when it started (step -1)."""
    yield prog.recv((prog.rank - 1) % prog.size, -1)


def shm_handshake(comm):
    """A program for the world group at start: each rank proves to each peer that the peer
    can map a segment it made (``SegmentPool.probe``); only then do large arrays to that
    peer take shared memory. It also serves as the start barrier."""
    def program(prog):
        r, n = prog.rank, prog.size
        ranks = prog.group.ranks
        probe = comm.shm.probe()
        record = list(probe) if probe is not None else None
        answers = {}
        try:
            for p in range(n):
                if p != r:
                    prog.send(p, 0, record)
            for p in range(n):
                if p != r:
                    x = yield prog.recv(p, 0)
                    ok = type(x) is list and len(x) == 3 and comm.shm.check_probe(ranks[p], *x)
                    prog.send(p, 1, bool(ok))
            for p in range(n):
                if p != r:
                    answers[ranks[p]] = (yield prog.recv(p, 1)) is True
        finally:
            if probe is not None:
                for rank, ok in answers.items():
                    comm.shm.probed(rank, probe, ok)
                comm.shm.pool.end_probe(probe[1])  # also when a peer never answered
    return program
