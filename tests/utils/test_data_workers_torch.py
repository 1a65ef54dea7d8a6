"""DataLoader worker processes against PyTorch's, behaviour by behaviour: which worker makes
which batch, how far ahead they work (``prefetch_factor``), the order batches arrive in
(``in_order``), unequal IterableDataset shards, persistent workers over epochs, a seeded
shuffle, errors in a worker, and ``pin_memory``'s warning. Each test runs the same dataset
through both loaders and compares what a user can see; every worker is reaped by the end."""
import os
import sys
import threading
import time
import warnings

import pytest

import distgrad
from distgrad.utils.data import DataLoader, DistributedSampler
from distgrad.utils.tempdirs import pid_alive

sys.path.insert(0, os.path.dirname(__file__))  # workers import data_helpers by name
import data_helpers as h  # noqa: E402

torch = pytest.importorskip("torch")
import torch.utils.data as tdata  # noqa: E402

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]

SETTLE = 0.3  # seconds with no new fetch that count as "the workers have stopped"


def values(batches):
    return [b.tolist() for b in batches]


def read_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [tuple(int(v) for v in line.split()) for line in fh.read().splitlines()]


def wait_for_fetches(path, count, deadline=20.0):
    """The log once it holds ``count`` fetches and no more arrive for SETTLE seconds."""
    end = time.monotonic() + deadline
    while len(read_log(path)) < count and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(SETTLE)
    return read_log(path)


def children():
    import multiprocessing
    return {p.pid for p in multiprocessing.active_children()}


@pytest.fixture
def no_leftovers():
    """The test's worker processes are all gone when it ends."""
    before = children()
    yield
    end = time.monotonic() + 10
    while children() - before and time.monotonic() < end:
        time.sleep(0.05)
    assert not children() - before


def run_stages(make_loader, log, workers, prefetch, steps):
    """How many batches (of 2) the workers have made after iter() and after each next(), and
    which worker fetched which index."""
    it = iter(make_loader())
    counts, got = [], []
    for consumed in range(steps + 1):
        if consumed:
            got.append(next(it).tolist())
        counts.append(len(wait_for_fetches(log, 2 * (workers * prefetch + consumed))) // 2)
    rest = [b.tolist() for b in it]
    return counts, got + rest, sorted(read_log(log))


@pytest.mark.parametrize("workers, prefetch", [(2, 3), (3, 1)])
def test_prefetch_and_round_robin_match_torch(tmp_path, no_leftovers, workers, prefetch):
    runs = {}
    for name, lib, loader_cls in (("torch", h.torch_worker_info, tdata.DataLoader),
                                  ("ours", None, DataLoader)):
        log = str(tmp_path / f"{name}.log")
        ds = h.Ints(20, log=log, worker_info=lib)
        runs[name] = run_stages(lambda: loader_cls(ds, batch_size=2, num_workers=workers,
                                                   prefetch_factor=prefetch), log, workers,
                                prefetch, steps=3)
    counts, got, fetched = runs["torch"]
    assert counts == [workers * prefetch + k for k in range(4)]  # the oracle, as documented
    assert runs["ours"] == runs["torch"]
    assert got == [[i, i + 1] for i in range(0, 20, 2)]
    assert fetched == sorted((i, (i // 2) % workers) for i in range(20))  # batch k: k % W


@pytest.mark.parametrize("in_order", [True, False])
def test_in_order_and_out_of_order_delivery_match_torch(in_order, tmp_path, no_leftovers):
    orders = {}
    for name, loader_cls in (("torch", tdata.DataLoader), ("ours", DataLoader)):
        gate = tmp_path / f"{name}.gate"  # batch 0 is made only once this exists
        loader = loader_cls(h.Ints(8, slow=[0], gate=str(gate)), batch_size=1, num_workers=2,
                            in_order=in_order)
        it = iter(loader)
        if in_order:  # batch 0 comes first however long it takes
            threading.Timer(0.5, gate.touch).start()
            orders[name] = values(it)
        else:  # worker 1's batches overtake it
            first = next(it).tolist()
            gate.touch()
            orders[name] = [first] + values(it)
    for order in orders.values():
        assert sorted(order) == [[i] for i in range(8)]
        if in_order:
            assert order == [[i] for i in range(8)]
        else:
            assert order[0] == [1] and order.index([0]) > 0
    assert orders["ours"] == orders["torch"] or not in_order


@pytest.mark.parametrize("sizes, batch_size, persistent", [
    ([3, 3], 2, False), ([1, 5, 2], 2, False), ([4, 0, 3], 1, False), ([1, 5, 2], 2, True)])
def test_unequal_iterable_shards_arrive_as_in_torch(sizes, batch_size, persistent, no_leftovers):
    ours = DataLoader(h.Shards(sizes), batch_size=batch_size, num_workers=len(sizes),
                      persistent_workers=persistent)
    theirs = tdata.DataLoader(h.torch_shards(sizes), batch_size=batch_size,
                              num_workers=len(sizes), persistent_workers=persistent)
    epochs = 2 if persistent else 1
    for _ in range(epochs):
        expected = values(theirs)
        assert sorted(v for b in expected for v in b) == \
            sorted(k * 100 + j for k, n in enumerate(sizes) for j in range(n))
        assert values(ours) == expected
    if persistent:
        ours._iterator._stop_workers()
        theirs._iterator._shutdown_workers()


def test_shuffled_distributed_sampler_with_workers_gives_torchs_batches(no_leftovers):
    ours_sampler = DistributedSampler(range(23), num_replicas=3, rank=1, shuffle=True, seed=7)
    theirs_sampler = tdata.DistributedSampler(range(23), num_replicas=3, rank=1, shuffle=True,
                                              seed=7)
    for epoch in (0, 1):
        ours_sampler.set_epoch(epoch)
        theirs_sampler.set_epoch(epoch)
        ours = DataLoader(h.Ints(23), batch_size=3, sampler=ours_sampler, num_workers=2)
        theirs = tdata.DataLoader(h.Ints(23), batch_size=3, sampler=theirs_sampler,
                                  num_workers=2)
        assert values(ours) == values(theirs)


def test_seeded_shuffle_is_the_same_with_and_without_workers(no_leftovers):
    def epoch(workers):
        g = distgrad.Generator().manual_seed(11)
        loader = DataLoader(h.Ints(17), batch_size=4, shuffle=True, generator=g,
                            num_workers=workers)
        return values(loader)
    assert epoch(0) == epoch(2) == epoch(3)


def test_worker_error_reads_as_torchs_and_the_epoch_goes_on(no_leftovers):
    texts, rests = {}, {}
    for name, loader_cls in (("torch", tdata.DataLoader), ("ours", DataLoader)):
        it = iter(loader_cls(h.Ints(6, bad=3), batch_size=2, num_workers=2))
        assert next(it).tolist() == [0, 1]
        with pytest.raises(ValueError) as info:
            next(it)
        texts[name] = str(info.value)
        rests[name] = values(it)
    for text in texts.values():
        assert text.startswith("Caught ValueError in DataLoader worker process 1.\n"
                               "Original Traceback (most recent call last):\n")
        assert text.rstrip().endswith("ValueError: sample 3 is broken")
    assert rests["ours"] == rests["torch"] == [[4, 5]]


def test_pin_memory_warns_as_torch_does_and_batches_are_unchanged(no_leftovers):
    caught = {}
    for name, loader_cls in (("torch", tdata.DataLoader), ("ours", DataLoader)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = values(loader_cls(h.Ints(5), batch_size=2, num_workers=1, pin_memory=True))
        caught[name] = sorted({str(x.message) for x in w})
        assert got == [[0, 1], [2, 3], [4]]
    assert caught["ours"] == caught["torch"]


def test_persistent_workers_keep_their_pids_and_prefetch_again_each_epoch(tmp_path,
                                                                           no_leftovers):
    log = str(tmp_path / "ours.log")
    loader = DataLoader(h.Ints(8, log=log), batch_size=2, num_workers=2, prefetch_factor=1,
                        persistent_workers=True)
    first = iter(loader)
    pids = [w.pid for w in first._workers]
    assert values(first) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(pid_alive(p) for p in pids)
    os.remove(log)
    second = iter(loader)
    assert second is first and [w.pid for w in second._workers] == pids
    assert len(wait_for_fetches(log, 4)) == 4  # two batches ahead again, one per worker
    assert values(second) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    first._stop_workers()
    assert not any(pid_alive(p) for p in pids)
