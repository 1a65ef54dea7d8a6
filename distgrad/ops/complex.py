"""Complex views and helpers: conj, real, imag, angle, complex, polar.

Gradients follow PyTorch's conjugate Wirtinger convention; the engine takes the
real part of a complex gradient that flows into a real input.
"""
import numpy as np

from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, defop, record, record_view
from .shape import stack
from .unary import cos, sin

__all__ = ["conj", "conj_physical", "real", "imag", "angle", "complex", "polar", "view_as_real",
           "is_complex", "is_floating_point"]

ConjBackward0 = defop("ConjBackward0", vjps=(lambda xp, g, m: xp.conj(g),))
RealBackward0 = defop("RealBackward0", vjps=(lambda xp, g, m: g,))
ImagBackward0 = defop("ImagBackward0", vjps=(lambda xp, g, m: g * 1j,))


def _angle_vjp(xp, g, m, x):
    xr = array_of(x) if isinstance(x, TensorBase) else x
    if xr.dtype.kind != "c":
        return g * 0
    nonzero = xr != 0
    # |x|^2 through xp, so the rule stays differentiable under create_graph.
    mag2 = xp.real(x * xp.conj(x))
    if not nonzero.all():
        mag2 = xp.where(nonzero, mag2, 1.0)
    return xp.mask(g * x * 1j / mag2, nonzero)


AngleBackward0 = defop("AngleBackward0", saved=("self",), vjps=(_angle_vjp,))
ComplexBackward0 = defop("ComplexBackward0", vjps=(
    lambda xp, g, m: g,
    lambda xp, g, m: g * -1j))


def conj(input):
    d = array_of(input)
    if d.dtype.kind != "c":
        return input
    return record(ConjBackward0, d.conj(), (input,))


conj_physical = conj


def real(input):
    d = array_of(input)
    if d.dtype.kind != "c":
        return input
    return record_view(RealBackward0, d.real, input, None, lambda a: a.real)


def imag(input):
    d = array_of(input)
    if d.dtype.kind != "c":
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return record_view(ImagBackward0, d.imag, input, None, lambda a: a.imag)


def angle(input):
    d = array_of(input)
    res = np.angle(d)
    if d.dtype.kind in "biu":
        res = res.astype(np.float32)
    return record(AngleBackward0, res.astype(d.real.dtype if d.dtype.kind in "fc" else res.dtype,
                                             copy=False), (input,), (input,))


def complex(real, imag):  # noqa: A001
    if array_of(real).dtype != array_of(imag).dtype or array_of(real).dtype.kind != "f":
        raise RuntimeError(f"Expected object of scalar type {real.dtype!r} but got scalar type "
                           f"{imag.dtype!r} for second argument")
    ctype = np.result_type(array_of(real).dtype, np.complex64)
    out = array_of(real).astype(ctype) + 1j * array_of(imag).astype(ctype)
    return record(ComplexBackward0, out.astype(ctype, copy=False), (real, imag))


def polar(abs, angle):  # noqa: A002
    return complex(abs * cos(angle), abs * sin(angle))


def view_as_real(input):
    return stack([real(input), imag(input)], -1)


def is_complex(input):
    return array_of(input).dtype.kind == "c"


def is_floating_point(input):
    return array_of(input).dtype.kind == "f"
