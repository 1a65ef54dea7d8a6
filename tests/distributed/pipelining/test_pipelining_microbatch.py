"""Micro-batch splitting and merging (PyTorch's test_microbatch cases, with PyTorch's own
functions as the oracle where it is installed) and :func:`pipeline` for nn.Sequential."""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.distributed.pipelining import SplitPoint, pipe_split, pipeline
from distgrad.distributed.pipelining.microbatch import (TensorChunkSpec, _Replicate,
                                                        merge_chunks,
                                                        split_args_kwargs_into_chunks,
                                                        sum_reducer)


def test_split_and_merge():
    x0, x1, x2 = (distgrad.randn(n, 512) for n in (128, 256, 512))
    args, kwargs = (x0, x1, x2), {"x0": x0, "x1": x1, "x2": x2}
    arg_chunks, kwarg_chunks = split_args_kwargs_into_chunks(args, kwargs, 2)
    assert len(arg_chunks) == len(kwarg_chunks) == 2
    assert [tuple(t.shape) for t in arg_chunks[0]] == [(64, 512), (128, 512), (256, 512)]
    assert kwarg_chunks[1]["x2"].shape == (256, 512)
    merged = merge_chunks(arg_chunks, (TensorChunkSpec(0),) * 3)
    assert all(bool((m == a).all()) for m, a in zip(merged, args))
    merged = merge_chunks(kwarg_chunks, {k: TensorChunkSpec(0) for k in kwargs})
    assert all(bool((merged[k] == kwargs[k]).all()) for k in kwargs)


def test_specs_values_and_uneven_sizes():
    x, mask = distgrad.randn(10, 3), distgrad.randn(2, 9)
    args, kwargs = split_args_kwargs_into_chunks(
        (x, 7), {"mask": mask}, 4, (TensorChunkSpec.from_tuple((0,))[0], _Replicate()),
        TensorChunkSpec.from_dict({"mask": 1}))
    assert [tuple(a[0].shape) for a in args] == [(3, 3), (3, 3), (2, 3), (2, 3)]
    assert [a[1] for a in args] == [7] * 4 and [tuple(k["mask"].shape) for k in kwargs] == \
        [(2, 3), (2, 2), (2, 2), (2, 2)]
    # fewer rows than chunks: fewer chunks, as PyTorch splits
    assert len(split_args_kwargs_into_chunks((distgrad.randn(3, 2),), None, 5)[0]) == 3
    assert str(TensorChunkSpec(1)) == "TensorChunkSpec(1)" and \
        repr(TensorChunkSpec(1)).endswith("microbatch.TensorChunkSpec(1)")


def test_split_sizes_are_pytorchs():
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining import microbatch as tm
    for rows, n in [(10, 4), (7, 7), (3, 5), (33, 4)]:
        ours = split_args_kwargs_into_chunks((distgrad.zeros(rows, 2),), {"k": 1}, n)
        theirs = tm.split_args_kwargs_into_chunks((torch.zeros(rows, 2),), {"k": 1}, n)
        assert [tuple(a[0].shape) for a in ours[0]] == [tuple(a[0].shape) for a in theirs[0]]
        assert ours[1] == theirs[1]


def test_merging_reduces_checks_and_complains():
    chunks = [(distgrad.tensor([1.0]), distgrad.tensor(2.0), "same") for _ in range(3)]
    cat, total, same = merge_chunks(chunks, (TensorChunkSpec(0), sum_reducer, None))
    assert cat.shape == (3,) and total.item() == 6.0 and same == "same"
    with pytest.raises(AssertionError, match="Expected a, got b"):
        merge_chunks([("a",), ("b",)], (None,))
    with pytest.raises(ValueError, match="did not match chunk spec"):
        merge_chunks([(1, 2)], (TensorChunkSpec(0),))
    with pytest.raises(ValueError, match="Unsupported chunk spec"):
        split_args_kwargs_into_chunks((3,), None, 2, (TensorChunkSpec(0),))
    assert split_args_kwargs_into_chunks((5,), None, 2, (_Replicate(),))[0] == [(5,), (5,)]


def _model():
    distgrad.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
                         nn.Linear(8, 4))


def test_pipeline_splits_a_sequential_where_the_spec_says():
    model = _model()
    x = distgrad.randn(4, 8)
    pipe = pipeline(model, mb_args=(x[:2],), split_spec={"2": SplitPoint.BEGINNING,
                                                          "3": SplitPoint.END})
    assert pipe.num_stages == 3
    keys = [list(pipe.get_stage_module(i).state_dict()) for i in range(3)]
    assert keys == [["0.weight", "0.bias"], ["2.weight", "2.bias"], ["4.weight", "4.bias"]]
    assert set(sum(keys, [])) <= set(model.state_dict())  # the model's own names
    np.testing.assert_array_equal(pipe(x)[0].detach().numpy(), model(x).detach().numpy())
    assert pipe.info().num_stages == 3


def test_what_needs_a_tracer_is_refused_clearly():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x):
            return self.b(self.a(x) + x)
    with pytest.raises(NotImplementedError, match="needs a tracer to split Custom"):
        pipeline(Custom(), mb_args=(distgrad.randn(1, 2),))
    with pytest.raises(NotImplementedError, match="no tracer"):
        pipe_split()
    with pytest.raises(ValueError, match="split_spec names 'layers.1', which is not a child"):
        pipeline(_model(), mb_args=None, split_spec={"layers.1": SplitPoint.END})
