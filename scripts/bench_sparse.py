"""Benchmark: sparse gradients, distgrad vs its NumPy floor and PyTorch (one thread each).

Two cases:

* ``embedding``: one training step of a large embedding table (``--vocab`` rows of 64
  float32, 2048 lookups): forward, backward to the table, one SGD step. With
  ``sparse=True`` the gradient is a sparse tensor of the rows looked up, so the step
  touches 2048 rows instead of the whole table; the dense layer (``sparse=False``) is
  timed beside it. The floor is the same step by hand: gather the rows, scatter
  ``-lr * grad`` back with ``np.add.at``.
* ``sparse.mm``: ``torch.sparse.mm`` of a 4096 x 4096 sparse matrix (1% non-zero)
  with a dense 4096 x 64 one, forward and backward (the sparse operand's gradient is
  sparse, on its own entries). The floor computes the product and the dense operand's
  gradient as sorted segment sums (``add.reduceat``), the sparse one's as row dot
  products.

Before timing, every candidate is checked to compute the same numbers as the floor.
Candidates are interleaved, medians of several repetitions. Prints a table and one
JSON line.

    python scripts/bench_sparse.py [--quick] [--vocab N]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layers import _single_threaded_reexec  # noqa: E402 - the same one-thread re-exec
from bench_optim import _time  # noqa: E402 - interleaved candidates, medians

DIM, LOOKUPS, LR = 64, 2048, 0.1
MM_N, MM_K, MM_DENSITY = 4096, 64, 0.01


# ---------------------------------------------------------------------- embedding step
def _embedding_data(vocab):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, DIM)).astype(np.float32)
    idx = rng.integers(0, vocab, LOOKUPS)
    scale = rng.standard_normal((LOOKUPS, DIM)).astype(np.float32)
    return table, idx, scale


class EmbeddingFloor:
    def __init__(self, table, idx, scale):
        self.table, self.idx, self.scale = table.copy(), idx, scale

    def step(self):
        rows = self.table[self.idx]              # forward
        loss = float((rows * self.scale).sum())
        np.add.at(self.table, self.idx, -LR * self.scale)  # d loss / d rows = scale
        return loss


def _embedding_candidate(lib, sparse, table, idx, scale):
    emb = lib.nn.Embedding.from_pretrained(lib.tensor(table.copy()), freeze=False, sparse=sparse)
    opt = lib.optim.SGD(emb.parameters(), lr=LR)
    index, weight = lib.tensor(idx), lib.tensor(scale)

    def step():
        opt.zero_grad()
        loss = (emb(index) * weight).sum()
        loss.backward()
        opt.step()
        return loss.item()
    return step, lambda: emb.weight.detach().numpy()


def _embedding_setups(vocab):
    import distgrad
    table, idx, scale = _embedding_data(vocab)
    floor = EmbeddingFloor(table, idx, scale)
    out = {"numpy floor": (floor.step, lambda: floor.table)}
    out["distgrad sparse"] = _embedding_candidate(distgrad, True, table, idx, scale)
    out["distgrad dense"] = _embedding_candidate(distgrad, False, table, idx, scale)
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(1)
    out["torch sparse"] = _embedding_candidate(torch, True, table, idx, scale)
    out["torch dense"] = _embedding_candidate(torch, False, table, idx, scale)
    return out


# ---------------------------------------------------------------------- sparse.mm
def _mm_data():
    rng = np.random.default_rng(1)
    nnz = int(MM_N * MM_N * MM_DENSITY)
    linear = np.unique(rng.integers(0, MM_N * MM_N, nnz))
    indices = np.stack(np.unravel_index(linear, (MM_N, MM_N))).astype(np.int64)
    values = rng.standard_normal(linear.size).astype(np.float32)
    dense = rng.standard_normal((MM_N, MM_K)).astype(np.float32)
    grad = rng.standard_normal((MM_N, MM_K)).astype(np.float32)
    return indices, values, dense, grad


def _rows_sum(rows, contrib, n):
    """Sum the rows of ``contrib`` by sorted ``rows`` (reduceat: far faster than add.at)."""
    out = np.zeros((n,) + contrib.shape[1:], contrib.dtype)
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    out[rows[starts]] = np.add.reduceat(contrib, starts, axis=0)
    return out


class MmFloor:
    """The product and both gradients by hand; the entries come sorted by row (coalesced)."""

    def __init__(self, indices, values, dense, grad):
        self.rows, self.cols = indices
        self.values, self.dense, self.grad = values, dense, grad

    def step(self):
        rows, cols, values = self.rows, self.cols, self.values
        out = _rows_sum(rows, values[:, None] * self.dense[cols], MM_N)
        grad_values = np.einsum("nk,nk->n", self.grad[rows], self.dense[cols])
        by_col = np.argsort(cols, kind="stable")
        grad_dense = _rows_sum(cols[by_col], (values[:, None] * self.grad[rows])[by_col], MM_N)
        self.result = (out, grad_values, grad_dense)
        return out


def _mm_candidate(lib, indices, values, dense, grad):
    a = lib.sparse_coo_tensor(lib.tensor(indices), lib.tensor(values), (MM_N, MM_N),
                              requires_grad=True).coalesce().detach().requires_grad_()
    b = lib.tensor(dense, requires_grad=True)
    g = lib.tensor(grad)
    state = {}

    def step():
        a.grad = b.grad = None
        out = lib.sparse.mm(a, b)
        out.backward(g)
        state["result"] = (out.detach().numpy(), a.grad.coalesce()._values().numpy(),
                           b.grad.numpy())
        return out
    return step, lambda: state["result"]


def _mm_setups():
    import distgrad
    data = _mm_data()
    floor = MmFloor(*data)
    out = {"numpy floor": (floor.step, lambda: floor.result),
           "distgrad": _mm_candidate(distgrad, *data)}
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(1)
    out["torch"] = _mm_candidate(torch, *data)
    return out


# ---------------------------------------------------------------------- harness
def _check_same(case, setups, reference):
    for step, _ in setups.values():
        step()
    ref = setups[reference][1]()
    for who, (_, result) in setups.items():
        mine = result()
        pairs = zip(mine, ref) if isinstance(ref, tuple) else [(mine, ref)]
        for a, b in pairs:
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{case}: {who} differs from the floor")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--vocab", type=int, default=200_000)
    args = ap.parse_args()
    _single_threaded_reexec()
    reps, batches = (2, 3) if args.quick else (5, 7)
    _check_same("embedding", _embedding_setups(args.vocab), "numpy floor")
    emb = _time(_embedding_setups(args.vocab), reps, batches)
    _check_same("sparse.mm", _mm_setups(), "numpy floor")
    mm = _time(_mm_setups(), reps, batches)
    print(f"embedding step: {args.vocab} x {DIM} float32 table, {LOOKUPS} lookups, SGD "
          "(one thread; medians, ms)")
    floor = emb["numpy floor"]
    for who, ms in emb.items():
        print(f"  {who:16s} {ms:9.2f}   x floor {ms / floor:6.2f}")
    print(f"torch.sparse.mm forward+backward: {MM_N} x {MM_N} at {MM_DENSITY:.0%} non-zero "
          f"@ {MM_N} x {MM_K} (one thread; medians, ms)")
    for who, ms in mm.items():
        print(f"  {who:16s} {ms:9.2f}   x floor {ms / mm['numpy floor']:6.2f}")
    result = {"bench": "sparse", "vocab": args.vocab,
              "embedding_ms": emb, "sparse_mm_ms": mm,
              "embedding_sparse_vs_floor": emb["distgrad sparse"] / floor,
              "sparse_mm_vs_floor": mm["distgrad"] / mm["numpy floor"]}
    if "torch sparse" in emb:
        result["embedding_sparse_vs_torch"] = emb["distgrad sparse"] / emb["torch sparse"]
        result["sparse_mm_vs_torch"] = mm["distgrad"] / mm["torch"]
    print(json.dumps(result))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_sparse"):  # with --record: its section of docs/performance.md
        main()
