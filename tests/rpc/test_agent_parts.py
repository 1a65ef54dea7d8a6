"""The parts the agent wires (``agent.py``'s map): each is given its collaborators, and each
keeps its promise on its own, without a world of processes."""
import ast
import collections
import inspect
import itertools

import pytest

from distgrad.rpc import caller, contexts, dispatch, events, interceptors, lifecycle, members
from distgrad.rpc.bookkeeping import Bookkeeping
from distgrad.rpc.calls import PendingCalls
from distgrad.rpc.caller import Caller
from distgrad.rpc.contexts import MessageContexts
from distgrad.rpc.errors import UnknownWorkerError, WorkerUnreachableError
from distgrad.rpc.events import Events
from distgrad.rpc.members import Members
from distgrad.rpc.owner import OwnerTable
from distgrad.rpc.worker_info import WorkerInfo

pytestmark = pytest.mark.timeout(30)

TABLE = [["w0", 0, "ipc://a", None], ["w1", 1, "ipc://b", None]]


class _State:
    running, closing, quiet = True, None, False


class _Transport:
    def __init__(self):
        self.sent = []
        self.gone = {}

    def down(self, rank):
        return self.gone.get(rank)

    def left(self, rank):
        return False

    def send(self, dst, frames):
        self.sent.append(dst)
        return True

    def on_io_thread(self):
        return False

    def wake(self):
        pass


class _SameHost:
    def __init__(self, log=None):
        self.given_back, self.log = [], log if log is not None else []

    def give_back(self, dst, names):
        self.given_back.append((dst, list(names)))

    def settle(self, src, segments, mapped=()):
        pass

    def peer_gone(self, rank):
        self.log.append(("same_host forgets", rank))


class _Failing:
    def on_send_message(self, dst, kind, what):
        raise RuntimeError("dropped by the test's interceptor")


def _caller(transport, same_host):
    mm = Members(TABLE)
    ctxs = MessageContexts(forks=None, allowlist=None, same_host=same_host, members=mm)
    opts = type("Options", (), {"rpc_timeout": 5.0, "backpressure": "block"})()
    return Caller("w0", 0, opts, _State(), mm, transport, None, PendingCalls(2, 4), ctxs,
                  Bookkeeping(2), itertools.count(1), collections.Counter())


def test_members_name_every_worker_one_way():
    mm = Members(TABLE)
    assert mm.worker_info("w1") == mm.worker_info(1) == mm.worker_info(WorkerInfo("w1", 1))
    assert mm.describe(1) == "worker 'w1' (rank 1)"
    with pytest.raises(UnknownWorkerError, match="unknown worker 'nobody'"):
        mm.worker_info("nobody")
    with pytest.raises(UnknownWorkerError, match=r"a rank in 0\.\.1"):
        mm.worker_info(2)
    with pytest.raises(UnknownWorkerError):
        mm.worker_info(True)


def test_both_call_paths_give_back_what_a_failed_interceptor_held():
    transport, same_host = _Transport(), _SameHost()
    c = _caller(transport, same_host)
    failing = _Failing()
    interceptors.add(failing, name="test_parts_failing")
    try:
        fut = c.call(1, "@test.op", (1, 2))
        with pytest.raises(RuntimeError, match="dropped by the test's interceptor"):
            fut.wait(5)
        with pytest.raises(RuntimeError, match="dropped by the test's interceptor"):
            c.notify(1, "@test.op", (1, 2))
    finally:
        interceptors.remove(failing)
    assert same_host.given_back == [(1, []), (1, [])]
    assert transport.sent == [] and len(c.calls) == 0


def test_a_call_to_a_peer_known_gone_fails_its_future_and_a_notice_is_not_sent():
    transport = _Transport()
    transport.gone[1] = "killed"
    c = _caller(transport, _SameHost())
    with pytest.raises(WorkerUnreachableError, match="worker 'w1' \\(rank 1\\) is unreachable: "
                                                     "killed"):
        c.call(1, "@test.op").wait(5)
    assert c.notify(1, "@test.op") is False and transport.sent == []


def test_a_peer_down_fails_its_calls_after_this_process_forgot_it():
    """A thread woken by the failure of its call finds the peer's segments reclaimed and
    its notices dropped already."""
    order = []

    class Caller_:
        def drop_calls_to(self, rank):
            order.append(("caller drops calls", rank))
            return ["a call"]

        def fail_dropped(self, rank, why, dropped):
            order.append(("caller fails", rank, why, tuple(dropped)))

    class Bookkeeping_(Bookkeeping):
        def forget_peer(self, peer):
            order.append(("bookkeeping forgets", peer))
            super().forget_peer(peer)

    class Pool:
        def submit(self, fn, *args):
            order.append(("listener queued", args))

    ev = Events("w0", 0, _State(), Bookkeeping_(2), OwnerTable(2), [lambda *a: None])
    ev.route(Members(TABLE), _Transport(), Caller_(), None, _SameHost(order), Pool())
    ev.on_peer_down(1, "killed", False)
    assert order == [("caller drops calls", 1), ("same_host forgets", 1),
                     ("bookkeeping forgets", 1), ("caller fails", 1, "killed", ("a call",)),
                     ("listener queued", (1, "killed", False))]


@pytest.mark.parametrize("module", [caller, contexts, dispatch, events, lifecycle, members])
def test_no_part_reaches_into_the_agent(module):
    """Each part is given what it uses at construction (the issue: no ``self.agent.<x>``)."""
    tree = ast.parse(inspect.getsource(module))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args}
    assert "agent" not in names and "current_agent" not in names
