"""Arithmetic: add, sub, mul, div, pow, neg and comparisons, forward and VJP side by side.

Complex gradients follow PyTorch's convention (conjugate Wirtinger): for a
holomorphic f the rule is ``g * conj(f'(z))``.
"""
import numpy as np

from ..autograd import dtype as _dt
from ..autograd.tensor import TensorBase
from .promotion import operands
from ..autograd._internal import array_of, wrap, defop, record

__all__ = ["add", "sub", "subtract", "rsub", "mul", "multiply", "div", "divide", "true_divide",
           "floor_divide", "remainder", "fmod", "pow", "neg", "negative", "reciprocal", "square",
           "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
           "equal", "allclose", "isclose", "isnan", "isinf", "isfinite"]

AddBackward0 = defop("AddBackward0", vjps=(
    lambda xp, g, m: g,
    lambda xp, g, m: g if m is None else g * m["alpha"]))
# PyTorch wraps a Python number in a tensor, so the scalar variants share the names.
# The scalar variants keep a second, empty edge for the number, as PyTorch does.
_NO_GRAD = (lambda xp, g, m: None)
AddScalarBackward = defop("AddBackward0", vjps=(lambda xp, g, m: g, _NO_GRAD))
SubBackward0 = defop("SubBackward0", vjps=(
    lambda xp, g, m: g,
    lambda xp, g, m: -g if m is None else g * -m["alpha"]))
SubScalarBackward = defop("SubBackward0", vjps=(lambda xp, g, m: g, _NO_GRAD))
RsubBackward1 = defop("RsubBackward1", vjps=(lambda xp, g, m: g * -m["alpha"],))
MulBackward0 = defop("MulBackward0", saved=("self", "other"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, y: g * xp.conj(y),
    lambda xp, g, m, x, y: g * xp.conj(x)))


def _conj_number(value):
    """The conjugate of a Python number as a Python number: NumPy keeps it a weak scalar,
    so a float32 gradient stays float32 (``np.conj(3)`` is a float64 that would promote it
    and cost a cast back)."""
    if isinstance(value, np.generic):
        value = value.item()
    return value.conjugate()


MulScalarBackward = defop("MulBackward0", vjps=(lambda xp, g, m: g * _conj_number(m["other"]),
                                                _NO_GRAD))
DivBackward0 = defop("DivBackward0", saved=("self", "other"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, y: g / xp.conj(y),
    lambda xp, g, m, x, y: -g * xp.conj(x / y / y)))
DivScalarBackward = defop("DivBackward0", vjps=(lambda xp, g, m: g / _conj_number(m["other"]),
                                                _NO_GRAD))
NegBackward0 = defop("NegBackward0", vjps=(lambda xp, g, m: -g,))
ReciprocalBackward0 = defop("ReciprocalBackward0", saved=("result",), vjps=(
    lambda xp, g, m, r: -g * xp.conj(r * r),))


def _pow_scalar_vjp(xp, g, m, x):
    e = m["exponent"]
    if e == 0:
        return g * 0
    return g * xp.conj(e * x ** (e - 1))


def _pow_exponent_vjp(xp, g, m, x, y, r):
    # d/dy x**y = x**y log x, and 0 where x == 0 and y >= 0 (PyTorch's convention).
    zero_base = (_raw(x) == 0) & (_raw(y).real >= 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        val = g * xp.conj(r * xp.log(x))
    return xp.mask(val, ~zero_base) if zero_base.any() else val


def _pow_base_vjp(xp, g, m, x, y, r):
    with np.errstate(divide="ignore", invalid="ignore"):
        return g * xp.conj(y * x ** (y - 1))


PowBackward0 = defop("PowBackward0", saved=("self",), vjps=(_pow_scalar_vjp,))
PowBackward1 = defop("PowBackward1", saved=("self", "exponent", "result"),
                     pack_reversed=True, vjps=(_pow_base_vjp, _pow_exponent_vjp))


def _rpow_vjp(xp, g, m, y, r):
    base = m["self"]
    with np.errstate(divide="ignore", invalid="ignore"):
        val = g * xp.conj(r * np.log(base))
        if base == 0:
            return xp.mask(val, _raw(y).real < 0)
    return val


PowBackward2 = defop("PowBackward2", saved=("exponent", "result"), vjps=(_rpow_vjp,))


def _raw(x):
    return array_of(x) if isinstance(x, TensorBase) else x


def add(input, other, *, alpha=1, out=None):
    a, b, ad, bd, dt = operands(input, other)
    if alpha != 1:
        bd = bd * alpha
    res = np.add(ad, bd)
    if a is None:
        return record(AddScalarBackward, res, (b, None))
    if b is None:
        return record(AddScalarBackward, res, (a, None))
    return record(AddBackward0, res, (a, b), (), None if alpha == 1 else {"alpha": alpha})


def sub(input, other, *, alpha=1):
    a, b, ad, bd, dt = operands(input, other)
    if dt.kind == "b":
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not "
                           "supported. Use the `^` or `logical_xor()` operator instead.")
    res = np.subtract(ad, bd * alpha if alpha != 1 else bd)
    if a is None:
        return record(RsubBackward1, res, (b,), (), {"alpha": alpha})
    if b is None:
        return record(SubScalarBackward, res, (a, None))
    return record(SubBackward0, res, (a, b), (), None if alpha == 1 else {"alpha": alpha})


subtract = sub


def rsub(input, other, *, alpha=1):
    """``other - alpha * input``."""
    return sub(other, input * alpha if alpha != 1 else input)


def mul(input, other):
    a, b, ad, bd, dt = operands(input, other)
    res = np.multiply(ad, bd)
    if a is None:
        return record(MulScalarBackward, res, (b, None), (), {"other": ad})
    if b is None:
        return record(MulScalarBackward, res, (a, None), (), {"other": bd})
    return record(MulBackward0, res, (a, b), (a, b))


multiply = mul


def div(input, other, *, rounding_mode=None):
    if rounding_mode is not None:
        if rounding_mode not in ("floor", "trunc"):
            raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or "
                               f"'floor' but found '{rounding_mode}'")
        a, b, ad, bd, dt = operands(input, other)
        rounding = np.floor_divide if rounding_mode == "floor" else _trunc_divide
        with np.errstate(divide="ignore", invalid="ignore"):
            res = rounding(ad, bd).astype(dt, copy=False)
        # Rounded quotients are piecewise constant: zero gradients, as PyTorch's DivBackward2.
        return record(DivBackward2, res, (a, b) if a is not None else (b,))
    a, b, ad, bd, dt = operands(input, other)
    if dt.kind in "biu":
        dt = _dt.get_default_dtype().numpy
        ad = ad.astype(dt) if isinstance(ad, np.ndarray) else ad
        bd = bd.astype(dt) if isinstance(bd, np.ndarray) else bd
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.true_divide(ad, bd)
    if a is None:  # number / tensor: reciprocal, then mul, as PyTorch records it
        return mul(reciprocal(b), ad)
    if b is None:
        return record(DivScalarBackward, res, (a, None), (), {"other": bd})
    return record(DivBackward0, res, (a, b), (a, b))


divide = div
true_divide = div


def _trunc_divide(a, b):
    return np.trunc(np.true_divide(a, b))


def _not_implemented(op):
    """The node PyTorch records for an op without a derivative: backward through it raises."""
    def vjp(xp, g, m):
        raise RuntimeError(f"derivative for aten::{op} is not implemented")
    return defop("NotImplemented", vjps=(vjp, vjp))


DivBackward2 = defop("DivBackward2", vjps=(lambda xp, g, m: g * 0, lambda xp, g, m: g * 0))
FloorDivideNotImplemented = _not_implemented("floor_divide")
RemainderNotImplemented = _not_implemented("remainder")
# remainder and fmod: d/dx = 1 almost everywhere, d/dy = -(x / y rounded), as in PyTorch.
RemainderBackward0 = defop("RemainderBackward0", vjps=(lambda xp, g, m: g,))
RemainderBackward1 = defop("RemainderBackward1", saved=("self", "other"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, y: g,
    lambda xp, g, m, x, y: -g * np.floor_divide(_raw(x), _raw(y))))
FmodBackward0 = defop("FmodBackward0", vjps=(lambda xp, g, m: g,))
FmodBackward1 = defop("FmodBackward1", saved=("self", "other"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, y: g,
    lambda xp, g, m, x, y: -g * _trunc_divide(_raw(x), _raw(y))))


def _rounding_op(ufunc, scalar_node, tensor_node, number_first_node):
    """floor_divide, remainder, fmod: one forward, the node chosen by which operands are
    tensors (a Python number on the left has no derivative in PyTorch either)."""
    def op(input, other):
        a, b, ad, bd, dt = operands(input, other)
        with np.errstate(divide="ignore", invalid="ignore"):
            res = ufunc(ad, bd).astype(dt, copy=False)
        if a is None:
            return record(number_first_node, res, (b,))
        if b is None:
            return record(scalar_node, res, (a,))
        return record(tensor_node, res, (a, b), (a, b) if tensor_node._saved_names else ())
    op.__name__ = op.__qualname__ = ufunc.__name__
    return op


floor_divide = _rounding_op(np.floor_divide, FloorDivideNotImplemented,
                            FloorDivideNotImplemented, FloorDivideNotImplemented)
remainder = _rounding_op(np.remainder, RemainderBackward0, RemainderBackward1,
                         RemainderNotImplemented)
fmod = _rounding_op(np.fmod, FmodBackward0, FmodBackward1, _not_implemented("fmod"))


def pow(input, exponent):  # noqa: A001
    if isinstance(input, TensorBase) and not isinstance(exponent, (TensorBase, np.ndarray)):
        a, _, ad, e, dt = operands(input, exponent)
        if dt.kind in "iu" and isinstance(e, int) and e < 0:
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        with np.errstate(divide="ignore", invalid="ignore"):
            res = _power(ad, e)
        return record(PowBackward0, res, (a,), (a,), {"exponent": e})
    if not isinstance(input, (TensorBase, np.ndarray)):
        _, b, base, bd, dt = operands(input, exponent)
        with np.errstate(divide="ignore", invalid="ignore"):
            res = np.power(base, bd)
        return record(PowBackward2, res, (b,), (b,), {"self": base})
    a, b, ad, bd, dt = operands(input, exponent)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.power(ad, bd)
    return record(PowBackward1, res, (a, b), (a, b))


def _power(a, e):
    """``a ** e`` for a Python number ``e``. NumPy's power with a float exponent is a
    general pow per element (GELU's ``x ** 3`` took 3x as long as ``x * x * x``); the
    exponents models use are products, square roots and reciprocals, as in PyTorch."""
    if a.dtype.kind not in "fc":
        return np.power(a, e)
    if e == 2:
        return np.multiply(a, a)
    if e == 3:
        out = np.multiply(a, a)
        if type(out) is not np.ndarray:  # a 0-d operand gives a NumPy scalar: no out=
            return out * a
        return np.multiply(out, a, out=out)
    if e == 0.5:
        return np.sqrt(a)
    if e == -1:
        return np.reciprocal(a)
    if e == 1:
        return a.copy()
    return np.power(a, e)


def neg(input):
    if array_of(input).dtype.kind == "b":
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you "
                           "are trying to invert a mask, use the `~` or `logical_not()` operator "
                           "instead.")
    return record(NegBackward0, np.negative(array_of(input)), (input,))


negative = neg


def reciprocal(input):
    d = array_of(input)
    if d.dtype.kind in "biu":
        d = d.astype(_dt.get_default_dtype().numpy)
    with np.errstate(divide="ignore"):
        return record(ReciprocalBackward0, np.reciprocal(d), (input,))


def square(input):
    return pow(input, 2)


def _compare(ufunc):
    def compare(input, other):
        a, b, ad, bd, dt = operands(input, other)
        return wrap(ufunc(ad, bd))
    compare.__name__ = ufunc.__name__
    return compare


eq = _compare(np.equal)
ne = _compare(np.not_equal)
lt = _compare(np.less)
le = _compare(np.less_equal)
gt = _compare(np.greater)
ge = _compare(np.greater_equal)
logical_and = _compare(np.logical_and)
logical_or = _compare(np.logical_or)


def logical_not(input):
    return wrap(np.logical_not(array_of(input)))


def isnan(input):
    return wrap(np.isnan(array_of(input)))


def isinf(input):
    return wrap(np.isinf(array_of(input)))


def isfinite(input):
    return wrap(np.isfinite(array_of(input)))


def equal(input, other):
    """True if both have the same shape and elements."""
    return array_of(input).shape == array_of(other).shape and bool(np.array_equal(array_of(input), array_of(other)))


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return bool(np.allclose(array_of(input), _raw(other), rtol=rtol, atol=atol, equal_nan=equal_nan))


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return wrap(np.isclose(array_of(input), _raw(other), rtol=rtol, atol=atol, equal_nan=equal_nan))
