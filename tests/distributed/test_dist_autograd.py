"""Distributed autograd: gradients across worker processes equal those of one process."""
import threading
import time

import numpy as np
import pytest

import distgrad
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.rpc import current_agent
from support import contexts
from support import dist_funcs as f

pytestmark = pytest.mark.timeout(60)

S1 = [(4, 5), (5,), (5, 5), (5,)]
S2 = [(5, 3), (3,)]


def _params(where, key, seed, shapes):
    """Same parameters on ``where`` (under key) and here (under key + '@local')."""
    rpc.rpc_sync(where, f.make_params, (key, seed, shapes))
    f.make_params(key + "@local", seed, shapes)
    return f.params(key + "@local")


def _close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g is not None, "missing gradient"
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-9)


def _ref(key, build):
    """Run ``build()`` (single process) and return .grad of the local copy of ``key``'s params."""
    ps = f.params(key + "@local")
    for p in ps:
        p.grad = None
    build().backward()
    return [p.grad.numpy() for p in ps]


@pytest.fixture
def world2(rpc_world):
    return rpc_world(2)


def _x(seed=0, shape=(3, 4)):
    return np.random.default_rng(seed).standard_normal(shape)


def test_two_stage_pipeline_matches_one_process(world2):
    _params("worker1", "s1", 1, S1)
    f.make_params("s2", 2, S2)
    x = distgrad.tensor(_x(), requires_grad=True)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage, ("s1", x))
        assert y.grad_fn.name() == "RecvRpcBackward"
        loss = f.stage("s2", y).sum()
        dist_autograd.backward(cid, [loss])
        g_here = dist_autograd.get_gradients(cid)
        g_w1 = rpc.rpc_sync("worker1", f.grads_of, (cid, "s1"))
        assert x.grad is None and all(p.grad is None for p in f.params("s2"))
        gx = g_here[x].numpy()
        g2 = [g_here[p].numpy() for p in f.params("s2")]
    xl = distgrad.tensor(_x(), requires_grad=True)
    want1 = _ref("s1", lambda: f.stage("s2", f.stage("s1@local", xl)).sum())
    _close(g_w1, want1)
    _close([gx], [xl.grad.numpy()])
    _close(g2, [p.grad.numpy() for p in f.params("s2")])
    assert rpc.rpc_sync("worker1", f.dot_grads_of_grad_attr, ("s1",)) == [None] * 4


@pytest.mark.timeout(60)
def test_chain_nested_diamond_twice_and_shared_parameter(rpc_world):
    rpc_world(3)
    # three-worker chain with a nested RPC (worker1 -> worker2) and a local reuse on worker1
    _params("worker1", "c1", 3, S1)
    _params("worker2", "c2", 4, [(5, 5), (5,)])
    x = distgrad.tensor(_x(1), requires_grad=True)
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", f.chain, ("c1", x, "worker2", "c2"))
        dist_autograd.backward(cid, [(out * out).sum()])
        got1 = rpc.rpc_sync("worker1", f.grads_of, (cid, "c1"))
        got2 = rpc.rpc_sync("worker2", f.grads_of, (cid, "c2"))
        gx = dist_autograd.get_gradients(cid)[x].numpy()
    xl = distgrad.tensor(_x(1), requires_grad=True)

    def chain_local():
        h = f.stage("c1@local", xl)
        o = f.stage("c2@local", h) * 2.0 + h
        return (o * o).sum()
    _close(got1, _ref("c1", chain_local))
    xl.grad = None
    _close(got2, _ref("c2", chain_local))
    _close([gx], [xl.grad.numpy()])

    # a diamond across workers: a tensor of worker1 used by two calls to worker2
    _params("worker1", "d1", 5, S1)
    _params("worker2", "db", 6, [(5, 5), (5,)])
    _params("worker2", "dc", 7, [(5, 5), (5,)])
    with dist_autograd.context() as cid:
        out = rpc.rpc_sync("worker1", f.diamond, ("d1", distgrad.tensor(_x(2)), "worker2", "db", "dc"))
        dist_autograd.backward(cid, [out.sum()])
        got = [rpc.rpc_sync("worker1", f.grads_of, (cid, "d1")),
               rpc.rpc_sync("worker2", f.grads_of, (cid, "db")),
               rpc.rpc_sync("worker2", f.grads_of, (cid, "dc"))]

    def diamond_local():
        a = f.stage("d1@local", distgrad.tensor(_x(2)))
        return (f.stage("db@local", a) * f.stage("dc@local", a)).sum()
    for key, g in zip(("d1", "db", "dc"), got):
        _close(g, _ref(key, diamond_local))

    # a result that returns to the coordinator twice (RRef fetched twice, and a pair)
    _params("worker2", "t1", 8, S1)
    with dist_autograd.context() as cid:
        rref = rpc.remote("worker2", f.stage, ("t1", distgrad.tensor(_x(3))))
        y1, y2 = rref.to_here(), rref.to_here()
        p1, p2 = rpc.rpc_sync("worker2", f.stage_pair, ("t1", distgrad.tensor(_x(4))))
        dist_autograd.backward(cid, [(y1 * y2).sum() + (p1 * p2 * 3.0).sum()])
        got = rpc.rpc_sync("worker2", f.grads_of, (cid, "t1"))
    _close(got, _ref("t1", lambda: (f.stage("t1@local", distgrad.tensor(_x(3))) ** 2).sum()
                     + (f.stage("t1@local", distgrad.tensor(_x(4))) ** 2 * 3.0).sum()))

    # a coordinator parameter used in calls to two workers
    w = distgrad.tensor(_x(5, (4, 4)), requires_grad=True)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", f.mul_add, (w, distgrad.tensor(_x(6, (4, 4)))))
        b = rpc.rpc_sync("worker2", f.mul_add, (w, distgrad.tensor(_x(7, (4, 4)))))
        dist_autograd.backward(cid, [(a * b).sum()])
        gw = dist_autograd.get_gradients(cid)[w].numpy()
    wl = distgrad.tensor(_x(5, (4, 4)), requires_grad=True)
    (f.mul_add(wl, distgrad.tensor(_x(6, (4, 4)))) * f.mul_add(wl, distgrad.tensor(_x(7, (4, 4))))).sum().backward()
    _close([gw], [wl.grad.numpy()])
    assert all(v == [] for v in contexts.live_everywhere().values())


def test_cycle_between_workers_and_unused_results_do_not_hang(world2):
    _params("worker1", "b1", 9, S1)
    _params("worker2", "b2", 10, [(5, 5), (5,)])
    _params("worker1", "b3", 18, [(5, 5), (5,)])
    x = distgrad.tensor(_x(8))
    with dist_autograd.context() as cid:
        # worker1 -> worker2 -> worker1 -> coordinator, with a result worker1 never uses
        out = rpc.rpc_sync("worker2", f.bounce, ("b2", rpc.rpc_sync("worker1", f.stage, ("b1", x)),
                                                 "worker1", "b3"))
        unused = rpc.rpc_sync("worker1", f.unused_call, ("b1", x, "worker2", "b2"))
        assert unused.requires_grad
        t0 = time.monotonic()
        dist_autograd.backward(cid, [out.sum()])
        assert time.monotonic() - t0 < 5.0
        got1 = rpc.rpc_sync("worker1", f.grads_of, (cid, "b1"))
        got2 = rpc.rpc_sync("worker2", f.grads_of, (cid, "b2"))
        got3 = rpc.rpc_sync("worker1", f.grads_of, (cid, "b3"))

    def local():
        h1 = f.stage("b1@local", x)
        h2 = f.stage("b2@local", h1)
        return (f.stage("b3@local", h2) + h2).sum()
    _close(got1, _ref("b1", local))
    _close(got2, _ref("b2", local))
    _close(got3, _ref("b3", local))


def test_retain_graph_accumulates_and_second_backward_names_the_worker(world2):
    _params("worker1", "r1", 11, S1)
    x = distgrad.tensor(_x(9))
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage, ("r1", x))
        loss = y.sum()  # no saved tensors on the coordinator: the worker must notice
        dist_autograd.backward(cid, [loss], retain_graph=True)
        once = rpc.rpc_sync("worker1", f.grads_of, (cid, "r1"))
        dist_autograd.backward(cid, [loss], retain_graph=True)
        twice = rpc.rpc_sync("worker1", f.grads_of, (cid, "r1"))
        _close(twice, [2 * g for g in once])
        dist_autograd.backward(cid, [loss])  # frees the graph everywhere
        with pytest.raises(RuntimeError, match=r"(?s)worker1.*retain_graph=True"):
            dist_autograd.backward(cid, [loss])
    _close(once, _ref("r1", lambda: f.stage("r1@local", x).sum()))
    assert contexts.live_everywhere() == {"worker0": [], "worker1": [], "worker2": []}


def test_concurrent_contexts_from_threads_do_not_mix(world2):
    _params("worker1", "m1", 12, S1)
    f.make_params("m2", 13, S2)
    results, errors = {}, []

    def run(k):
        try:
            x = distgrad.tensor(_x(20 + k))
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("worker1", f.stage, ("m1", x))
                loss = (f.stage("m2", y) * (k + 1)).sum()
                dist_autograd.backward(cid, [loss])
                results[k] = (rpc.rpc_sync("worker1", f.grads_of, (cid, "m1")),
                              [dist_autograd.get_gradients(cid)[p].numpy() for p in f.params("m2")])
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors, errors
    f.make_params("m2@local", 13, S2)
    for k in range(6):
        x = distgrad.tensor(_x(20 + k))
        for p in f.params("m2@local"):
            p.grad = None
        _close(results[k][0], _ref("m1", lambda: (f.stage("m2@local", f.stage("m1@local", x)) * (k + 1)).sum()))
        _close(results[k][1], [p.grad.numpy() for p in f.params("m2@local")])


def test_held_contexts_interleave_with_a_thread_of_their_own(world2):
    # distgrad's HeldContext: two steps' forwards sent, each in its own context, then the
    # backwards in order, all on one thread; each has its own gradients, as two threads'
    _params("worker1", "h1", 14, S1)
    f.make_params("h2", 15, S2)
    held = [dist_autograd.HeldContext() for _ in range(2)]
    futs = []
    for k, h in enumerate(held):
        with h.entered():
            assert dist_autograd.current_context_id() == h.context_id
            futs.append(rpc.rpc_async("worker1", f.stage, ("h1", distgrad.tensor(_x(30 + k)))))
    assert dist_autograd.current_context_id() is None
    with dist_autograd.context() as other:  # a context of this thread meanwhile is fine
        assert other not in (held[0].context_id, held[1].context_id)
    grads = []
    for k, (h, fut) in enumerate(zip(held, futs)):
        loss = (f.stage("h2", fut.wait()) * (k + 1)).sum()
        dist_autograd.backward(h.context_id, [loss])
        grads.append(rpc.rpc_sync("worker1", f.grads_of, (h.context_id, "h1")))
        h.release()
        h.release()  # harmless
        with pytest.raises(RuntimeError, match="Could not find autograd context"):
            dist_autograd.get_gradients(h.context_id)
    f.make_params("h2@local", 15, S2)
    for k in range(2):
        x = distgrad.tensor(_x(30 + k))
        _close(grads[k], _ref("h1", lambda: (f.stage("h2@local", f.stage("h1@local", x))
                                             * (k + 1)).sum()))


def test_error_in_worker_backward_reaches_coordinator_and_context_releases(world2):
    _params("worker1", "e1", 14, S1)
    _params("worker2", "e2", 15, S1)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", f.fail_in_backward, ("e1", distgrad.tensor(_x(30))))
        b = rpc.rpc_sync("worker2", f.stage, ("e2", distgrad.tensor(_x(31))))
        # PyTorch's class and words ("Error on Node <rank>: <message>"), and the worker
        with pytest.raises(RuntimeError, match=r"(?s)Error on Node 1: boom in backward.*worker1"):
            dist_autograd.backward(cid, [(a * b).sum()])
    assert all(v == [] for v in contexts.live_everywhere().values())
    with dist_autograd.context() as cid:  # the world still works
        b = rpc.rpc_sync("worker2", f.stage, ("e2", distgrad.tensor(_x(31))))
        dist_autograd.backward(cid, [b.sum()])


def test_extensions_see_the_end_of_each_part_before_backward_returns(world2):
    # on_backward_end runs once per pass, after the part's last gradient and before its
    # completion reply (a launch stage steps its optimizer there); its error fails the pass
    _params("worker1", "n1", 18, S1)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage_noting_ends, ("n1", distgrad.tensor(_x(34))))
        dist_autograd.backward(cid, [y.sum()], retain_graph=True)
        assert rpc.rpc_sync("worker1", f.ends_noted) == [4]
        dist_autograd.backward(cid, [(y * 2).sum()])
        assert rpc.rpc_sync("worker1", f.ends_noted) == [4]
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage_noting_ends, ("n1", distgrad.tensor(_x(34)), True))
        with pytest.raises(RuntimeError, match=r"(?s)Error on Node 1: boom at the end.*worker1"):
            dist_autograd.backward(cid, [y.sum()])
    assert all(v == [] for v in contexts.live_everywhere().values())


@pytest.mark.timeout(60)
def test_worker_killed_mid_backward_is_an_error_within_heartbeat_bound(rpc_world):
    rpc_world(2)
    _params("worker1", "k1", 16, S1)
    _params("worker2", "k2", 17, S1)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", f.die_in_backward, ("k1", distgrad.tensor(_x(32))))
        b = rpc.rpc_sync("worker2", f.stage, ("k2", distgrad.tensor(_x(33))))
        t0 = time.monotonic()
        with pytest.raises(rpc.WorkerUnreachableError, match="worker1"):
            dist_autograd.backward(cid, [(a * b).sum()])
        assert time.monotonic() - t0 < 10.0
    assert contexts.live_on("worker2") == []


@pytest.mark.timeout(60)
def test_worker_part_that_never_finishes_times_out_naming_the_worker(rpc_world):
    rpc_world(1, rpc_timeout=1.5)
    _params("worker1", "h1", 21, S1)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.hang_in_backward, ("h1", distgrad.tensor(_x(41))))
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="worker1"):
            dist_autograd.backward(cid, [(y * distgrad.ones(1, requires_grad=True)).sum()])
        assert time.monotonic() - t0 < 3.0
    time.sleep(2.0)  # the hung part ends on a released context: harmless
    assert contexts.live_on("worker1") == []


def test_a_first_call_in_a_context_installs_the_recording_on_the_way(rpc_world):
    # the peer learns to record this context's tensors from the call itself (its header
    # names the installer): no round trip before it
    rpc_world(2)
    agent = current_agent()
    _params("worker2", "i2", 60, S1)
    x = distgrad.tensor(_x(60), requires_grad=True)
    with dist_autograd.context() as cid:
        sent = agent.stats["messages_sent"]
        y = rpc.rpc_sync("worker2", f.stage, ("i2", x))
        assert agent.stats["messages_sent"] - sent == 1
        dist_autograd.backward(cid, [y.sum()])
        got = rpc.rpc_sync("worker2", f.grads_of, (cid, "i2"))
    _close(got, _ref("i2", lambda: f.stage("i2@local", distgrad.tensor(_x(60))).sum()))


# Parts that their first gradient starts: rank 0 -> worker1 (a stage) -> worker2
# (``fn(key, h)``). The coordinator never talks to worker2: worker1's gradient carries the
# plan that starts worker2's part, and worker2 reports its end to the coordinator.
S2_IN = [(5, 5), (5,)]


def _via_worker1(fn, seed):
    _params("worker1", "q1", seed, S1)
    _params("worker2", "q2", seed + 1, S2_IN)
    x = distgrad.tensor(_x(seed), requires_grad=True)
    return rpc.rpc_sync("worker1", f.chain_to, ("q1", x, "worker2", fn, "q2"))


def test_a_part_its_first_gradient_starts_needs_no_message_of_its_own(rpc_world):
    rpc_world(2)
    agent = current_agent()
    with dist_autograd.context() as cid:
        y = _via_worker1(f.stage, 50)
        sent = agent.stats["messages_sent"]
        dist_autograd.backward(cid, [y.sum()], retain_graph=True)
        # one message left the coordinator: worker1's start with its first gradient
        assert agent.stats["messages_sent"] - sent == 1
        dist_autograd.backward(cid, [y.sum()])  # retain_graph travelled with the plan
        got = rpc.rpc_sync("worker2", f.grads_of, (cid, "q2"))
    xl = distgrad.tensor(_x(50))
    want = _ref("q2", lambda: f.stage("q2@local", f.stage("q1@local", xl)).sum())
    _close(got, [2 * w for w in want])
    assert all(v == [] for v in contexts.live_everywhere().values())


def test_a_part_its_first_gradient_starts_reports_its_error(rpc_world):
    rpc_world(2)
    with dist_autograd.context() as cid:
        y = _via_worker1(f.fail_in_backward, 52)
        with pytest.raises(RuntimeError, match=r"(?s)Error on Node 2: boom in backward.*worker2"):
            dist_autograd.backward(cid, [y.sum()])
    assert all(v == [] for v in contexts.live_everywhere().values())


@pytest.mark.timeout(60)
def test_a_part_its_first_gradient_starts_dies_and_the_pass_names_it(rpc_world):
    rpc_world(2)
    with dist_autograd.context() as cid:
        y = _via_worker1(f.die_in_backward, 54)
        t0 = time.monotonic()
        with pytest.raises(rpc.WorkerUnreachableError, match="worker2"):
            dist_autograd.backward(cid, [y.sum()])
        assert time.monotonic() - t0 < 10.0
    assert contexts.live_on("worker1") == []


@pytest.mark.timeout(60)
def test_a_part_its_first_gradient_starts_times_out_naming_it(rpc_world):
    # worker1 finishes (worker2's gradient reached it before worker2 stalls): only the
    # coordinator's watch of worker2's report can end the pass
    rpc_world(2, rpc_timeout=1.5)
    with dist_autograd.context() as cid:
        y = _via_worker1(f.stage_stalling_at_end, 56)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="worker2"):
            dist_autograd.backward(cid, [y.sum()])
        assert time.monotonic() - t0 < 3.0
    # the stalled part ends on a released context: harmless
    assert contexts.live_on("worker2", timeout=10.0) == []


def test_context_released_while_its_rpc_runs_is_harmless(world2):
    _params("worker1", "l1", 19, S1)
    x = distgrad.tensor(_x(40), requires_grad=True)
    with dist_autograd.context() as cid:
        fut = rpc.rpc_async("worker1", f.slow_stage, ("l1", x, 0.5))
    assert contexts.live_everywhere() == {"worker0": [], "worker1": [], "worker2": []}
    y = fut.wait()  # the reply of a released context: plain data, nothing recorded
    assert y.requires_grad and y.grad_fn is None
    assert contexts.live_everywhere() == {"worker0": [], "worker1": [], "worker2": []}
    with pytest.raises(RuntimeError, match="Could not find autograd context"):
        dist_autograd.get_gradients(cid)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage, ("l1", x))
        dist_autograd.backward(cid, [y.sum()])
        assert x in dist_autograd.get_gradients(cid)


@pytest.mark.timeout(60)
def test_leaving_a_context_does_not_wait_for_a_stalled_worker(rpc_world, caplog):
    """As PyTorch: the release is sent, not awaited; a release that fails is logged."""
    world = rpc_world(2, rpc_timeout=1.0)
    _params("worker1", "s1", 22, S1)
    _params("worker2", "s2", 23, S1)
    x = distgrad.tensor(_x(42), requires_grad=True)
    with dist_autograd.context() as cid:
        a = rpc.rpc_sync("worker1", f.stage, ("s1", x))
        b = rpc.rpc_sync("worker2", f.stage, ("s2", x))
        dist_autograd.backward(cid, [(a * b).sum()])
        world.pause("worker2")
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 0.5
    assert contexts.live_on("worker1") == []
    with caplog.at_level("WARNING", logger="distgrad.distributed"):
        deadline = time.monotonic() + 10
        while not any(f"context {cid} on worker2" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the failed release was not logged"
            time.sleep(0.05)
    world.resume("worker2")
    assert contexts.live_on("worker2") == []  # the release was delivered once it resumed


def test_a_received_tensor_ships_its_gradient_before_later_local_work(world2, monkeypatch):
    # A pipeline stage's backward overlaps with its upstream stage's only if the gradient
    # of a tensor that came over RPC leaves as soon as it is ready, not after local work
    # of micro-batches that were created later (higher sequence numbers run first).
    from distgrad.distributed.autograd import engine
    events = []
    ship = engine.Part.ship

    def recording_ship(self, recv, g):
        events.append("shipped")
        return ship(self, recv, g)
    monkeypatch.setattr(engine.Part, "ship", recording_ship)
    x = distgrad.tensor(_x(), requires_grad=True)
    later = distgrad.tensor(_x(1), requires_grad=True)
    with dist_autograd.context() as cid:
        received = rpc.rpc_sync("worker1", f.mul_add, (x, x))  # RecvRpcBackward here
        local = later * 5  # created after the receive: a higher sequence number
        local.register_hook(lambda g: events.append("local work"))
        dist_autograd.backward(cid, [(received + local * 1).sum()])
        assert dist_autograd.get_gradients(cid)[later].numpy() == pytest.approx(
            np.full((3, 4), 5.0))
    assert events == ["shipped", "local work"]
