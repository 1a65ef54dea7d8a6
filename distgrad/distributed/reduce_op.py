"""``ReduceOp`` and the NumPy kernels that combine two contributions to a reduction.

Every algorithm combines contributions with :func:`combine` in a fixed order (the
order of ranks, or the ring's fixed order per chunk), so every rank computes the
same bits and a rerun computes the same bits again.
"""
import enum

import numpy as np

__all__ = ["ReduceOp", "reduce_op", "check_op", "combine", "finish", "op_name"]


class _RedOpType(enum.IntEnum):
    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9

    def __str__(self):
        return f"RedOpType.{self.name}"


_RedOpType.__name__ = _RedOpType.__qualname__ = "RedOpType"  # repr: <RedOpType.SUM: 0>


class ReduceOp:
    """How contributions combine: ``ReduceOp.SUM``, ``AVG``, ``PRODUCT``, ``MIN``, ``MAX``,
    ``BAND``, ``BOR``, ``BXOR`` (``PREMUL_SUM`` is NCCL's and is refused)."""

    RedOpType = _RedOpType
    SUM = _RedOpType.SUM
    AVG = _RedOpType.AVG
    PRODUCT = _RedOpType.PRODUCT
    MIN = _RedOpType.MIN
    MAX = _RedOpType.MAX
    BAND = _RedOpType.BAND
    BOR = _RedOpType.BOR
    BXOR = _RedOpType.BXOR
    PREMUL_SUM = _RedOpType.PREMUL_SUM
    UNUSED = _RedOpType.UNUSED

    def __init__(self, op=_RedOpType.SUM):
        self.op = _RedOpType(op.op if isinstance(op, ReduceOp) else op)

    def __eq__(self, other):
        other = other.op if isinstance(other, ReduceOp) else other
        return self.op == other

    def __hash__(self):
        return hash(self.op)

    def __repr__(self):
        return f"ReduceOp({self.op!r})"


class reduce_op:  # noqa: N801 - PyTorch's deprecated spelling, kept for old programs
    SUM, PRODUCT, MIN, MAX = ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX


_UFUNC = {_RedOpType.SUM: np.add, _RedOpType.AVG: np.add, _RedOpType.PRODUCT: np.multiply,
          _RedOpType.MIN: np.minimum, _RedOpType.MAX: np.maximum,
          _RedOpType.BAND: np.bitwise_and, _RedOpType.BOR: np.bitwise_or,
          _RedOpType.BXOR: np.bitwise_xor}


def op_name(op):
    return _RedOpType(op).name


def check_op(op, dtype, collective):
    """``op`` as a RedOpType, after PyTorch's checks of the op against the dtype."""
    if isinstance(op, ReduceOp):
        op = op.op
    try:
        op = _RedOpType(op)
    except (ValueError, TypeError):
        raise ValueError(f"{collective}: op must be a ReduceOp, not {op!r}") from None
    if op not in _UFUNC:
        raise ValueError(f"{collective}: ReduceOp.{op.name} is not supported by the CPU backend")
    kind = np.dtype(dtype).kind
    if kind == "c" and op in (_RedOpType.MIN, _RedOpType.MAX):
        raise ValueError(f"{collective} does not support RedOpType.{op.name} on complex tensors")
    if op in (_RedOpType.BAND, _RedOpType.BOR, _RedOpType.BXOR) and kind not in "biu":
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")
    if op == _RedOpType.AVG and kind in "biu":
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{_TORCH_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)}")
    return op


_TORCH_NAMES = {"int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
                "uint8": "Byte", "bool": "Bool"}


def combine(op, a, b, out=None):
    """``a (op) b``, into ``out`` (which may be ``a`` or ``b``) or a new array."""
    if a.dtype == np.bool_ and op in (_RedOpType.SUM, _RedOpType.AVG):
        return np.logical_or(a, b, out=out)
    if a.dtype == np.bool_ and op == _RedOpType.PRODUCT:
        return np.logical_and(a, b, out=out)
    return _UFUNC[op](a, b, out=out)


def finish(op, acc, n):
    """The last touch of a reduction over ``n`` ranks (AVG divides; in place)."""
    if op == _RedOpType.AVG and n > 1:
        np.divide(acc, n, out=acc)
