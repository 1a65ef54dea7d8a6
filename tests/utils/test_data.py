"""distgrad.utils.data in one process: datasets, samplers, collation and the DataLoader,
compared with torch.utils.data where PyTorch is installed."""
import collections
import itertools
import math

import numpy as np
import pytest

import distgrad
from distgrad.utils import data
from distgrad.utils.data.torch_order import torch_randperm

pytestmark = pytest.mark.timeout(60)

Point = collections.namedtuple("Point", ["x", "y"])


def plain(obj):
    """A batch as nested Python values, the same for distgrad's and PyTorch's tensors."""
    if hasattr(obj, "tolist") and hasattr(obj, "dtype") and not isinstance(obj, np.ndarray):
        return ("tensor", str(obj.dtype).rpartition(".")[2], tuple(obj.shape), obj.tolist())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (type(obj).__name__,) + tuple(plain(x) for x in obj)
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [plain(x) for x in obj])
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.tolist())
    return obj


def as_torch(obj, torch):
    """The same sample with PyTorch tensors in place of distgrad's."""
    if isinstance(obj, distgrad.Tensor):
        return torch.from_numpy(np.array(obj.numpy()))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(as_torch(x, torch) for x in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_torch(x, torch) for x in obj)
    if isinstance(obj, dict):
        return {k: as_torch(v, torch) for k, v in obj.items()}
    return obj


BATCHES = {
    "tensors": [distgrad.tensor([1.0, 2.0]), distgrad.tensor([3.0, 4.0])],
    "int_tensors": [distgrad.tensor(1), distgrad.tensor(2)],
    "floats": [1.5, 2.5, 3.0],
    "ints": [1, 2, 3],
    "bools": [True, False],
    "strings": ["a", "b"],
    "bytes": [b"a", b"b"],
    "np_arrays": [np.arange(3, dtype=np.float32), np.ones(3, dtype=np.float32)],
    "np_int_arrays": [np.arange(2, dtype=np.int32), np.arange(2, dtype=np.int32)],
    "np_scalars": [np.float64(1.0), np.float64(2.0)],
    "np_int_scalars": [np.int64(1), np.int64(7)],
    "np_bool_scalars": [np.bool_(True), np.bool_(False)],
    "dicts": [{"x": distgrad.tensor([1.0]), "y": 0, "s": "a"},
              {"x": distgrad.tensor([2.0]), "y": 1, "s": "b"}],
    "namedtuples": [Point(distgrad.tensor([1.0]), 2), Point(distgrad.tensor([3.0]), 4)],
    "tuples": [(distgrad.tensor([1.0]), 1), (distgrad.tensor([2.0]), 2)],
    "lists": [[1, 2.0], [3, 4.0]],
    "nested": [{"a": [(1, 2.0)], "b": {"c": np.float32(1)}},
               {"a": [(3, 4.0)], "b": {"c": np.float32(2)}}],
}


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_default_collate_matches_torch(name):
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate
    batch = BATCHES[name]
    assert plain(data.default_collate(batch)) == plain(torch_collate(as_torch(batch, torch)))


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_default_convert_matches_torch(name):
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_convert as torch_convert
    batch = BATCHES[name]
    assert plain(data.default_convert(batch)) == plain(torch_convert(as_torch(batch, torch)))


@pytest.mark.parametrize("batch", [[[1, 2], [3]], [object(), object()],
                                   [np.array(["a"]), np.array(["b"])]])
def test_default_collate_errors_match_torch(batch):
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate
    with pytest.raises(Exception) as expected:
        torch_collate(batch)
    with pytest.raises(expected.type) as got:
        data.default_collate(batch)
    assert str(got.value).split(";")[0] == str(expected.value).split(";")[0]


class Squares(data.Dataset):
    def __init__(self, n, tensor_module):
        self.n, self.t = n, tensor_module

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": self.t.tensor([float(i), float(i * i)]), "y": i, "p": Point(i, float(i))}


LOADER_CASES = [
    dict(batch_size=3),
    dict(batch_size=3, drop_last=True),
    dict(batch_size=4, sampler=[5, 1, 9, 0, 3, 3, 7]),
    dict(batch_size=None),
    dict(batch_sampler=[[0, 5], [9], [2, 2, 1]]),
    dict(batch_size=2, collate_fn=lambda b: [s["y"] for s in b]),
]


@pytest.mark.parametrize("kwargs", LOADER_CASES, ids=lambda kw: ",".join(kw))
def test_dataloader_batches_match_torch(kwargs):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader as TorchLoader
    ours = data.DataLoader(Squares(10, distgrad), **kwargs)
    theirs = TorchLoader(Squares(10, torch), **kwargs)
    assert len(ours) == len(theirs)
    assert [plain(b) for b in ours] == [plain(b) for b in theirs]


def test_shuffle_with_a_seeded_generator_is_a_repeatable_permutation():
    def epoch(seed):
        g = distgrad.Generator().manual_seed(seed)
        loader = data.DataLoader(data.TensorDataset(distgrad.arange(20)), batch_size=6,
                                 shuffle=True, generator=g)
        return [i for (b,) in loader for i in b.tolist()]
    first = epoch(0)
    assert sorted(first) == list(range(20)) and first == epoch(0) and first != epoch(1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_workers=-1), "num_workers option should be non-negative"),
    (dict(timeout=-1), "timeout option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified"),
    (dict(num_workers=1, prefetch_factor=-1), "prefetch_factor option should be non-negative"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(multiprocessing_context="spawn"), "multiprocessing_context can only be used"),
    (dict(num_workers=1, multiprocessing_context="nope"), "should specify a valid start method"),
])
def test_dataloader_argument_errors_match_torch(kwargs, message):
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=message) as expected:
        torch.utils.data.DataLoader(list(range(4)), **kwargs)
    with pytest.raises(ValueError) as got:
        data.DataLoader(list(range(4)), **kwargs)
    assert str(got.value) == str(expected.value)


def test_dataloader_attributes_are_frozen_and_iterable_dataset_rules():
    loader = data.DataLoader(list(range(4)), batch_size=2)
    with pytest.raises(ValueError, match="batch_size attribute should not be set after"):
        loader.batch_size = 3
    stream = RangeStream(5)
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        data.DataLoader(stream, shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified sampler option"):
        data.DataLoader(stream, sampler=[0])
    loader = data.DataLoader(stream, batch_size=2, drop_last=True)
    assert len(loader) == 2 and [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert [b.tolist() for b in data.DataLoader(stream, batch_size=2)] == [[0, 1], [2, 3], [4]]
    with pytest.warns(UserWarning, match="'pin_memory' argument is set as true"):
        assert len(list(data.DataLoader(list(range(3)), pin_memory=True))) == 3


class RangeStream(data.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_get_worker_info_is_none_in_the_main_process():
    assert data.get_worker_info() is None


def test_datasets_match_torch():
    torch = pytest.importorskip("torch")
    tdata = torch.utils.data
    a, b = distgrad.arange(10).reshape(5, 2), distgrad.arange(5)
    ta, tb = torch.arange(10).reshape(5, 2), torch.arange(5)
    pairs = [(data.TensorDataset(a, b), tdata.TensorDataset(ta, tb))]
    pairs.append((data.ConcatDataset([pairs[0][0], data.TensorDataset(a[:2], b[:2])]),
                  tdata.ConcatDataset([pairs[0][1], tdata.TensorDataset(ta[:2], tb[:2])])))
    pairs.append((data.Subset(pairs[1][0], [6, 0, 3]), tdata.Subset(pairs[1][1], [6, 0, 3])))
    pairs.append((data.StackDataset(pairs[0][0], b), tdata.StackDataset(pairs[0][1], tb)))
    pairs.append((data.StackDataset(u=b, v=b), tdata.StackDataset(u=tb, v=tb)))
    for ours, theirs in pairs:
        assert len(ours) == len(theirs)
        assert [plain(ours[i]) for i in range(len(ours))] == \
               [plain(theirs[i]) for i in range(len(theirs))]
    concat, tconcat = pairs[1]
    assert plain(concat[-1]) == plain(tconcat[-1]) and concat.cumulative_sizes == [5, 7]
    assert isinstance(pairs[0][0] + pairs[0][0], data.ConcatDataset)
    chain = RangeStream(2) + RangeStream(3)
    assert isinstance(chain, data.ChainDataset) and list(chain) == [0, 1, 0, 1, 2]
    assert len(chain) == 5
    for call, exc in [(lambda: data.TensorDataset(a, b[:3]), AssertionError),
                      (lambda: concat[-8], ValueError),
                      (lambda: data.ConcatDataset([]), AssertionError),
                      (lambda: data.StackDataset(b, b[:2]), ValueError)]:
        with pytest.raises(exc):
            call()


@pytest.mark.parametrize("lengths", [[3, 7], [0.3, 0.7], [0.5, 0.25, 0.25], [0.33, 0.33, 0.34]])
def test_random_split_sizes_match_torch_and_partition(lengths):
    torch = pytest.importorskip("torch")
    ds = list(range(10))
    ours = data.random_split(ds, lengths, generator=distgrad.Generator().manual_seed(0))
    theirs = torch.utils.data.random_split(ds, lengths, generator=torch.Generator().manual_seed(0))
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    everything = [i for s in ours for i in s]
    assert sorted(everything) == ds
    again = data.random_split(ds, lengths, generator=distgrad.Generator().manual_seed(0))
    assert [list(s) for s in again] == [list(s) for s in ours]


def test_random_split_errors():
    with pytest.raises(ValueError, match="Sum of input lengths does not equal"):
        data.random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="Fraction at index 1 is not between 0 and 1"):
        data.random_split(range(10), [0.5, -0.5, 1.0])
    with pytest.warns(UserWarning, match="Length of split at index 1 is 0"):
        data.random_split(range(1), [0.5, 0.5])


def test_sequential_and_batch_samplers_match_torch():
    torch = pytest.importorskip("torch")
    tdata = torch.utils.data
    assert list(data.SequentialSampler(range(4))) == list(tdata.SequentialSampler(range(4)))
    for size, drop in itertools.product((1, 3, 4, 7), (False, True)):
        ours = data.BatchSampler(data.SequentialSampler(range(10)), size, drop)
        theirs = tdata.BatchSampler(tdata.SequentialSampler(range(10)), size, drop)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="batch_size should be a positive integer"):
            data.BatchSampler(range(3), bad, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean"):
        data.BatchSampler(range(3), 1, 0)


def test_random_sampler():
    g = distgrad.Generator().manual_seed(3)
    order = list(data.RandomSampler(range(10), generator=g))
    assert sorted(order) == list(range(10))
    assert order == list(data.RandomSampler(range(10), generator=distgrad.Generator()
                                            .manual_seed(3)))
    longer = list(data.RandomSampler(range(4), num_samples=10))
    assert len(longer) == 10 and sorted(longer[:8]) == sorted(list(range(4)) * 2)
    drawn = list(data.RandomSampler(range(3), replacement=True, num_samples=70))
    assert len(drawn) == 70 and set(drawn) <= {0, 1, 2}
    assert len(data.RandomSampler(range(3), replacement=True, num_samples=70)) == 70
    with pytest.raises(TypeError, match="replacement should be a boolean value"):
        data.RandomSampler(range(3), replacement=1)
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        data.RandomSampler(range(3), num_samples=0)


def test_subset_random_and_weighted_samplers():
    torch = pytest.importorskip("torch")
    assert sorted(data.SubsetRandomSampler([7, 3, 5])) == [3, 5, 7]
    weights = [0.0, 1.0, 3.0, 0.0, 2.0]
    drawn = list(data.WeightedRandomSampler(weights, 600, generator=distgrad.Generator()))
    counts = collections.Counter(drawn)
    assert set(counts) == {1, 2, 4} and counts[2] > counts[4] > counts[1]
    distinct = list(data.WeightedRandomSampler(weights, 3, replacement=False))
    assert sorted(distinct) == [1, 2, 4]
    everything = list(data.WeightedRandomSampler(weights, 5, replacement=False))
    assert sorted(everything[:3]) == [1, 2, 4] and sorted(everything[3:]) == [0, 3]
    for args in [([0.0, 0.0], 2), ([1.0, 1.0], 3, False), ([-1.0, 1.0], 1), ([[1.0]], 1),
                 ([1.0], 0), ([1.0], 1, 1)]:
        with pytest.raises(Exception) as expected:
            list(torch.utils.data.WeightedRandomSampler(*args))
        with pytest.raises(expected.type) as got:
            list(data.WeightedRandomSampler(*args))
        assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("n, seed", [(0, 0), (1, 5), (10, 0), (257, 42), (1000, 2 ** 40 + 3)])
def test_torch_randperm_is_torchs(n, seed):
    torch = pytest.importorskip("torch")
    g = torch.Generator()
    g.manual_seed(seed)
    assert torch_randperm(n, seed) == torch.randperm(n, generator=g).tolist()


@pytest.mark.parametrize("n, replicas", [(10, 3), (12, 4), (5, 8), (1, 2), (17, 1)])
@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (False, False), (True, True),
                                                (False, True)])
def test_distributed_sampler_gives_torchs_indices(n, replicas, shuffle, drop_last):
    torch = pytest.importorskip("torch")
    for epoch, seed in ((0, 0), (3, 11)):
        shards = []
        for rank in range(replicas):
            kw = dict(num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed,
                      drop_last=drop_last)
            ours = data.DistributedSampler(range(n), **kw)
            theirs = torch.utils.data.DistributedSampler(range(n), **kw)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)
            shards.append(list(ours))
        # the partition: equal sizes; complete without drop_last, disjoint with it
        assert len({len(s) for s in shards}) == 1
        flat = [i for s in shards for i in s]
        if drop_last:
            assert len(flat) == len(set(flat)) == replicas * (n // replicas)
        else:
            assert set(flat) == set(range(n)) and len(flat) == replicas * math.ceil(n / replicas)


def test_distributed_sampler_errors():
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval \[0, 2\]"):
        data.DistributedSampler(range(4), num_replicas=3, rank=3)
    with pytest.raises((RuntimeError, ValueError)):  # no default process group
        data.DistributedSampler(range(4))


def test_lazy_import_and_torch_names():
    torch = pytest.importorskip("torch")
    assert distgrad.utils.data is data
    missing = set(torch.utils.data.__all__) - set(data.__all__)
    # DataPipes are PyTorch's deprecated streaming API: not provided
    assert all("DataPipe" in m or m in {"DataChunk", "_DatasetKind", "argument_validation",
                                         "functional_datapipe", "guaranteed_datapipes_determinism",
                                         "non_deterministic", "runtime_validation",
                                         "runtime_validation_disabled"} for m in missing), missing
