"""Sparse COO tensors against PyTorch: values, layouts, node names and gradient layouts.

Each case is a function of the library module (``distgrad`` or ``torch``) returning a
dict of named results; :func:`both` runs it on both and compares every tensor: layout,
dtype, shape, the values (sparse ones coalesced: indices exactly, values closely) and
``grad_fn`` names. Without torch the distgrad run still happens and the explicit
expectations in the cases are checked.
"""
import numpy as np
import pytest

import distgrad
from distgrad import codec
from distgrad.testing.oracle import torch

I = [[0, 1, 1], [2, 0, 2]]  # noqa: E741 - PyTorch's tests call it i too
V = [3.2, 4.1, 5.3]


def build(m, coalesce=False, requires_grad=True, dtype=None):
    """dist_autograd_test.py's ``build_sparse_tensor``."""
    t = m.sparse_coo_tensor(I, V, (3, 3), requires_grad=requires_grad,
                            dtype=dtype or m.float32)
    return t.coalesce() if coalesce else t


def _name(x):
    return type(x).__name__ if x is not None else None


def _describe(t):
    """What is compared of a tensor, as plain data."""
    out = {"sparse": t.is_sparse, "dtype": str(t.dtype).split(".")[-1], "shape": tuple(t.shape),
           "grad_fn": _name(t.grad_fn)}
    t = t.detach()
    if t.is_sparse:
        c = t.coalesce()
        out["indices"] = c._indices().numpy().tolist()
        out["values"] = c._values().numpy()
    else:
        out["values"] = t.numpy()
    return out


def _compare(key, ours, theirs):
    if isinstance(theirs, (tuple, list)):
        assert len(ours) == len(theirs), key
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _compare(f"{key}[{i}]", a, b)
        return
    if theirs is None or not isinstance(theirs, torch.Tensor):
        assert ours == theirs, f"{key}: {ours!r} vs torch {theirs!r}"
        return
    a, b = _describe(ours), _describe(theirs)
    for field in ("sparse", "dtype", "shape", "grad_fn", "indices"):
        assert a.get(field) == b.get(field), f"{key}.{field}: {a.get(field)} vs torch {b.get(field)}"
    np.testing.assert_allclose(a["values"], b["values"], rtol=1e-5, atol=1e-6, err_msg=key)


def both(case):
    """``case(m)`` on distgrad and (when installed) on torch, compared; distgrad's result."""
    ours = case(distgrad)
    if torch is not None:
        theirs = case(torch)
        assert ours.keys() == theirs.keys()
        for key in ours:
            _compare(key, ours[key], theirs[key])
    return ours


def test_construction_and_introspection():
    def case(m):
        a = build(m)
        inferred = m.sparse_coo_tensor(m.tensor([[0, 2], [1, 0]]), m.tensor([1.0, 2.0]))
        hybrid = m.sparse_coo_tensor([[0, 2]], [[1.0, 2.0], [3.0, 4.0]], (4, 2))
        return {"a": a, "inferred": inferred, "hybrid": hybrid, "is_sparse": a.is_sparse,
                "dense_is_sparse": m.ones(2).is_sparse, "layout": str(a.layout).split(".")[-1],
                "strided": str(m.ones(1).layout).split(".")[-1], "nnz": a._nnz(),
                "dims": (a.sparse_dim(), a.dense_dim(), hybrid.sparse_dim(), hybrid.dense_dim()),
                "numel": a.numel(), "dim": a.dim(), "coalesced": a.is_coalesced(),
                "requires_grad": a.requires_grad, "is_leaf": a.is_leaf,
                "float64": build(m, dtype=m.float64)}
    out = both(case)
    assert out["layout"] == "sparse_coo" and out["nnz"] == 3 and not out["coalesced"]
    assert out["inferred"].shape == (3, 2)


def test_coalesce_sums_duplicates_and_values_need_it():
    def case(m):
        t = m.sparse_coo_tensor([[2, 0, 2]], [1.0, 2.0, 3.0], (3,), requires_grad=True)
        c = t.coalesce()
        (c.values() * m.tensor([1.0, 10.0])).sum().backward()
        return {"c": c, "indices": c.indices(), "values": c.values(), "grad": t.grad,
                "coalesced": c.is_coalesced(), "same": c.coalesce() is c}
    out = both(case)
    assert out["values"].tolist() == [2.0, 4.0]
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(RuntimeError, match="uncoalesced"):
            build(m).values()


def test_add_sub_mul_and_their_gradients():
    def case(m):
        a, b = build(m), build(m)
        w = m.arange(9.0).reshape(3, 3).requires_grad_()
        s = m.add(a, b)
        d = a - b * 2
        p = a * b
        pd = a * w          # sparse * dense: sparse, and the dense input's gradient too
        dense = w + a       # dense + sparse: dense
        scaled = a * 3 / 2
        loss = m.sparse.sum(s) + m.sparse.sum(d) + m.sparse.sum(p) + m.sparse.sum(pd) + \
            dense.sum() + m.sparse.sum(scaled)
        loss.backward()
        return {"s": s, "d": d, "p": p, "pd": pd, "dense": dense, "scaled": scaled,
                "a.grad": a.grad, "b.grad": b.grad, "w.grad": w.grad}
    out = both(case)
    assert out["a.grad"].is_sparse is False  # the dense + sparse term makes it dense
    assert out["pd"].is_sparse and out["dense"].is_sparse is False


def test_sparse_only_gradients_are_sparse():
    def case(m):
        a, b = build(m), build(m)
        loss = m.sparse.sum(a * b)
        loss.backward()
        return {"loss": loss, "a.grad": a.grad, "b.grad": b.grad}
    out = both(case)
    assert out["a.grad"].is_sparse


def test_sparse_plus_dense_is_refused_as_in_pytorch():
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
            build(m) + m.ones(3, 3)


def test_mixed_dtypes_promote():
    def case(m):
        a, b = build(m), build(m, dtype=m.float64)
        s = m.add(a, b)
        m.sparse.sum(s).backward()
        return {"s": s, "a.grad": a.grad, "b.grad": b.grad}
    both(case)


def test_stack_and_cat():
    def case(m):
        a, b = build(m), build(m, coalesce=True)
        st = m.stack((a, b))
        st1 = m.stack([a, b], 1)
        ct = m.cat([a, b])
        m.sparse.sum(st * 2).backward()  # (PyTorch cannot differentiate a sparse cat)
        return {"st": st, "st1": st1, "ct": ct, "a.grad": a.grad}
    both(case)


def test_to_dense_to_sparse_and_back():
    def case(m):
        a = build(m)
        d = a.to_dense()
        (d * m.arange(9.0).reshape(3, 3)).sum().backward()
        x = m.tensor([[0.0, 1.5], [2.0, 0.0]], requires_grad=True)
        s = x.to_sparse()
        m.sparse.sum(s * s).backward()
        return {"d": d, "a.grad": a.grad, "s": s, "x.grad": x.grad,
                "s_coalesced": s.is_coalesced(), "dense_to_dense": x.to_dense() is x}
    out = both(case)
    assert out["a.grad"].is_sparse and not out["x.grad"].is_sparse


def test_sparse_sum_over_dims():
    def case(m):
        a = build(m)
        h = m.sparse_coo_tensor([[0, 2, 2]], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], (4, 2),
                                requires_grad=True)
        r0 = m.sparse.sum(a, 0)
        r01 = m.sparse.sum(a, (0, 1))
        hd = m.sparse.sum(h, 1)
        (m.sparse.sum(r0 * r0) + r01 + m.sparse.sum(hd * hd)).backward()
        return {"r0": r0, "r01": r01, "hd": hd, "a.grad": a.grad, "h.grad": h.grad,
                "full": m.sparse.sum(a), "sum": a.sum()}
    both(case)


@pytest.mark.parametrize("how", ["sparse.mm", "mm", "spmm", "matmul"])
def test_matrix_products(how):
    def case(m):
        a = build(m)
        x = m.tensor(np.linspace(-1, 1, 6).reshape(3, 2), dtype=m.float32, requires_grad=True)
        fn = {"sparse.mm": m.sparse.mm, "mm": m.mm, "spmm": m.spmm, "matmul": m.matmul}[how]
        r = fn(a, x)
        (r * m.tensor([[1.0, -2.0]])).sum().backward()
        left = m.mm(m.ones(2, 3), a) if how == "mm" else None
        return {"r": r, "a.grad": a.grad, "x.grad": x.grad, "left": left}
    out = both(case)
    assert out["a.grad"].is_sparse == (how == "sparse.mm")


def test_embedding_gradients_are_sparse():
    def case(m):
        w = m.tensor(np.arange(10.0).reshape(5, 2), dtype=m.float32)
        emb = m.nn.Embedding.from_pretrained(w, freeze=False, sparse=True, padding_idx=4)
        out = emb(m.tensor([[1, 3], [1, 4]]))
        (out * m.tensor([1.0, -1.0])).sum().backward()
        wb = m.tensor(np.arange(12.0).reshape(6, 2), dtype=m.float32, requires_grad=True)
        psw = m.tensor([0.5, 1.0, 2.0, 1.5], requires_grad=True)
        bag = m.nn.functional.embedding_bag(m.tensor([1, 2, 4, 1]), wb, m.tensor([0, 2]),
                                            mode="sum", sparse=True, per_sample_weights=psw)
        bag.sum().backward()
        mean = m.nn.EmbeddingBag(6, 2, mode="mean", sparse=True)
        with m.no_grad():
            mean.weight.copy_(wb)
        mean(m.tensor([[0, 5, 5]])).sum().backward()
        return {"out": out, "grad": emb.weight.grad, "bag": bag, "wb.grad": wb.grad,
                "psw.grad": psw.grad, "mean.grad": mean.weight.grad}
    out = both(case)
    assert out["grad"].is_sparse and out["wb.grad"].is_sparse


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_optimizer_step_with_a_sparse_gradient(momentum):
    def case(m):
        emb = m.nn.Embedding(4, 3, sparse=True)
        with m.no_grad():
            emb.weight.copy_(m.arange(12.0).reshape(4, 3))
        opt = m.optim.SGD(emb.parameters(), lr=0.5, momentum=momentum)
        for _ in range(2):
            opt.zero_grad()
            emb(m.tensor([0, 2, 2])).pow(2).sum().backward()
            opt.step()
        return {"weight": emb.weight.detach()}
    both(case)


def test_sparse_gradients_accumulate():
    def case(m):
        a = build(m)
        m.sparse.sum(a * 2).backward()
        m.sparse.sum(a * 3).backward()
        w = m.ones(3, 3, requires_grad=True)
        (w * 2).sum().backward()       # a dense .grad first ...
        m.sparse.sum(w * a).backward()  # ... then a sparse one is added into it
        return {"a.grad": a.grad, "w.grad": w.grad}
    both(case)


def test_unsupported_ops_raise_instead_of_densifying():
    a = build(distgrad)
    for op in (lambda: a.exp(), lambda: a.view(9), lambda: a[0], lambda: a.mean(),
               lambda: a + 1, lambda: 2 / a, lambda: distgrad.equal(a, a)):
        with pytest.raises(NotImplementedError, match="SparseCPU"):
            op()
    for to_numpy in (a.numpy, lambda: np.asarray(a.detach())):
        with pytest.raises(TypeError, match="to_dense"):
            to_numpy()
    with pytest.raises(RuntimeError, match="data pointer"):
        a.data_ptr()
    with pytest.raises(NotImplementedError):  # the storage itself refuses to become dense
        np.asarray(a._data)


def test_invalid_construction_is_refused():
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(RuntimeError, match="same nnz"):
            m.sparse_coo_tensor([[0, 1]], [1.0], (2,))
        with pytest.raises(RuntimeError, match="size is inconsistent with indices"):
            m.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,), check_invariants=True)
    with pytest.raises(RuntimeError, match="negative index"):
        distgrad.sparse_coo_tensor([[0, -1]], [1.0, 2.0], (3,))


def test_sparse_tensors_travel_through_the_codec():
    a = build(distgrad).coalesce()
    back = codec.loads(codec.dumps({"a": a, "b": build(distgrad, requires_grad=False)}))
    assert back["a"].is_sparse and back["a"].requires_grad and back["a"].is_coalesced()
    assert back["a"]._indices().tolist() == I
    assert np.allclose(back["a"]._values().numpy(), V)
    assert not back["b"].requires_grad and not back["b"].is_coalesced()


def _forged(indices, values, shape, coalesced=False):
    from distgrad.sparse.coo import COO
    t = distgrad.Tensor._wrap(np.zeros(1))
    t._data = COO(np.asarray(indices, dtype=np.int64), np.asarray(values), shape, coalesced)
    return codec.dumps(t)


@pytest.mark.parametrize("indices,values,shape,why", [
    ([[0, 3]], [1.0, 2.0], [3], "outside its shape"),
    ([[0, -1]], [1.0, 2.0], [3], "outside its shape"),
    ([[0, 1]], [1.0], [3], "does not fit"),
    ([[0, 1]], [1.0, 2.0], [3, 3], "does not fit"),
])
def test_a_malformed_sparse_tensor_from_a_peer_is_refused(indices, values, shape, why):
    with pytest.raises(codec.CodecError, match=why):
        codec.loads(_forged(indices, values, shape))


def test_a_false_claim_of_being_coalesced_is_not_believed():
    back = codec.loads(_forged([[2, 0, 2]], [1.0, 2.0, 3.0], [3], coalesced=True))
    assert not back.is_coalesced()
    assert back.coalesce().to_dense().tolist() == [2.0, 0.0, 4.0]


@pytest.mark.parametrize("make,message", [
    (lambda m, p: m.optim.Adam(p), "Adam does not support sparse gradients"),
    (lambda m, p: m.optim.RMSprop(p), "RMSprop does not support sparse gradients"),
    (lambda m, p: m.optim.Adagrad(p, weight_decay=0.1), "weight_decay option is not compatible"),
])
def test_optimizers_without_a_sparse_update_refuse_sparse_gradients(make, message):
    for m in [distgrad] + ([torch] if torch is not None else []):
        emb = m.nn.Embedding(4, 3, sparse=True)
        emb(m.tensor([1])).sum().backward()
        with pytest.raises(RuntimeError, match=message):
            make(m, emb.parameters()).step()


def test_adagrad_with_a_sparse_gradient():
    def case(m):
        emb = m.nn.Embedding(4, 2, sparse=True)
        with m.no_grad():
            emb.weight.copy_(m.arange(8.0).reshape(4, 2))
        opt = m.optim.Adagrad(emb.parameters(), lr=0.3)
        for idx in ([0, 2], [2, 3]):
            opt.zero_grad()
            emb(m.tensor(idx)).pow(2).sum().backward()
            opt.step()
        return {"weight": emb.weight.detach()}
    both(case)


def test_gather_with_a_sparse_gradient():
    def case(m):
        x = m.tensor(np.arange(12.0).reshape(3, 4), dtype=m.float32, requires_grad=True)
        index = m.tensor([[0, 2], [1, 1], [3, 0]])
        y = m.gather(x, 1, index, sparse_grad=True)
        (y * m.tensor([1.0, 2.0])).sum().backward()
        z = x.gather(0, m.tensor([[2, 0, 1, 1]]), sparse_grad=True)
        z.sum().backward()
        return {"y": y, "grad": x.grad}
    out = both(case)
    assert out["grad"].is_sparse
