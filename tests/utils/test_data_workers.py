"""DataLoader with real worker processes: order, collation through the codec, worker info and
seeds, persistent workers, and failures (an exception, a SIGKILL, a timeout), with every worker
reaped, checked by pid."""
import os
import sys

import pytest

import distgrad
from distgrad.utils.data import DataLoader
from distgrad.utils.tempdirs import pid_alive

sys.path.insert(0, os.path.dirname(__file__))  # workers import data_helpers by name
import data_helpers as h  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def iterators():
    """Iterators the test makes; their workers are shut down at teardown, pass or fail."""
    made = []
    yield made
    for it in made:
        it._stop_workers()


def worker_pids(it):
    return [w.pid for w in it._workers]


def reaped(pids):
    return not any(pid_alive(p) for p in pids)


def plain(batch):
    if isinstance(batch, dict):
        return {k: plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(plain(x) for x in batch) if not hasattr(batch, "_fields") \
            else type(batch)(*(plain(x) for x in batch))
    if isinstance(batch, distgrad.Tensor):
        return (str(batch.dtype), batch.tolist())
    return batch


def test_persistent_workers_deliver_torchs_batches_in_order_every_epoch(iterators):
    order = [7, 2, 9, 0, 4, 4, 1, 8, 3, 6, 5]
    loader = DataLoader(h.Squares(10, "dict"), batch_size=3, sampler=order, num_workers=2,
                        persistent_workers=True, prefetch_factor=1)
    single = [plain(b) for b in DataLoader(h.Squares(10, "dict"), batch_size=3, sampler=order)]
    it = iter(loader)
    iterators.append(it)
    pids = worker_pids(it)
    assert [plain(b) for b in it] == single
    assert reaped([]) and all(pid_alive(p) for p in pids)  # persistent: still there
    partial = iter(loader)
    assert partial is it and plain(next(partial)) == single[0]  # an epoch cut short ...
    assert [plain(b) for b in iter(loader)] == single  # ... leaves nothing behind
    assert worker_pids(it) == pids
    batch = single and next(iter(loader))
    assert batch["x"].dtype is distgrad.float32 and batch["name"] == ["s7", "s2", "s9"]
    batch["x"].add_(1)  # batches are writable, as PyTorch's are
    it._stop_workers()
    assert reaped(pids)


def test_matches_torch_for_the_same_sampler_indices():
    torch = pytest.importorskip("torch")
    order = [3, 1, 4, 1, 5, 9, 2, 6]
    loader = DataLoader(h.Squares(10, "pair"), batch_size=3, sampler=order, num_workers=1)
    it = iter(loader)
    pids = worker_pids(it)
    ours = list(it)
    theirs = list(torch.utils.data.DataLoader(h.TorchSquares(10), batch_size=3, sampler=order))
    assert [type(b).__name__ for b in ours] == ["Pair"] * 3  # the namedtuple survived the trip
    assert [(b.x.tolist(), b.y.tolist()) for b in ours] == \
           [(b.x.tolist(), b.y.tolist()) for b in theirs]
    assert [str(b.y.dtype)[-5:] for b in ours] == [str(b.y.dtype)[-5:] for b in theirs]
    assert reaped(pids)  # exhausted: workers stopped and joined


def test_iterable_split_worker_info_seeds_and_init_fn(iterators):
    g = distgrad.Generator().manual_seed(5)
    loader = DataLoader(h.Range(0, 7), batch_size=2, num_workers=2, worker_init_fn=h.tag_worker,
                        generator=g)
    it = iter(loader)
    iterators.append(it)
    batches = [[column.tolist() for column in batch] for batch in it]
    # Split with get_worker_info as in PyTorch's documentation: batches alternate between the
    # workers, and a worker whose stream has ended drops out (PyTorch gives the same values).
    assert [b[0] for b in batches] == [[0, 1], [4, 5], [2, 3], [6]]
    workers = [b[1][0] for b in batches]
    assert workers == [0, 1, 0, 1] and all(b[2] == [2] * len(b[0]) for b in batches)
    seeds = {b[1][0]: b[3][0] for b in batches}
    assert seeds == {0: it._base_seed, 1: it._base_seed + 1}
    assert {b[1][0]: b[4][0] for b in batches} == dict(enumerate(worker_pids(it)))
    assert [b[5][0] for b in batches] == [100, 101, 100, 101]  # set on each worker's copy


def test_worker_exception_is_raised_with_its_traceback_and_loading_goes_on(iterators):
    it = iter(DataLoader(h.Troubled(8, bad=2, unsendable=5), batch_size=2, num_workers=1,
                         collate_fn=h.as_list))
    iterators.append(it)
    pids = worker_pids(it)
    assert [type(s).__name__ for s in next(it)] == ["Pair", "Pair"]
    with pytest.raises(KeyError) as info:
        next(it)
    text = info.value.args[0]
    assert text.startswith("Caught KeyError in DataLoader worker process 0.\n"
                           "Original Traceback (most recent call last):\n")
    assert "data_helpers.py" in text and "KeyError: 'no sample 2'" in text
    with pytest.raises(TypeError, match="cannot be sent to the main process"):
        next(it)
    assert [s.y for s in next(it)] == [6, 7]
    with pytest.raises(StopIteration):
        next(it)
    assert reaped(pids)


def test_killed_worker_raises_runtime_error_naming_it(tmp_path, iterators):
    marker = tmp_path / "victim"
    it = iter(DataLoader(h.Killing(6, bad=2, path=str(marker)), batch_size=2, num_workers=1))
    iterators.append(it)
    pids = worker_pids(it)
    assert next(it)[1].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid\(s\) (\d+)\) exited "
                                           r"unexpectedly") as info:
        next(it)
    assert str(pids[0]) in str(info.value) and marker.read_text() == str(pids[0])
    assert reaped(pids)


def test_timeout_raises_and_a_dropped_iterator_reaps_its_workers():
    it = iter(DataLoader(h.Slow(4), batch_size=2, num_workers=1, timeout=0.3))
    pids = worker_pids(it)
    with pytest.raises(RuntimeError, match="DataLoader timed out after 0.3 seconds"):
        next(it)
    del it  # garbage: the worker, busy in a 5 s sleep, is terminated and joined
    assert reaped(pids)
