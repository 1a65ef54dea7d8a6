"""Printing tensors as PyTorch prints them (``torch/_tensor_str.py``'s rules).

One formatter per tensor decides, from its non-zero finite values, between integer
mode (``tensor([1., 2.])``), fixed point with ``precision`` digits
(``tensor(0.0020)``), and scientific notation (when the largest magnitude is more
than 1000 times the smallest, above 1e8, or below 1e-4), and pads every element to
one width. Tensors of more than ``threshold`` elements are summarised to
``edgeitems`` per edge; lines wrap at ``linewidth``. The suffixes follow: ``dtype``
unless it is the default float or complex, int64 or bool, ``size`` of an empty
tensor, the ``grad_fn`` or ``requires_grad=True``; a sparse tensor prints its
indices and values. ``set_printoptions`` / ``printoptions`` change the options.

>>> import distgrad
>>> distgrad.tensor([0.002, 1.5])
tensor([0.0020, 1.5000])
>>> distgrad.tensor([1.0, 2.0], requires_grad=True)
tensor([1., 2.], requires_grad=True)
>>> distgrad.tensor([1e-6, 1.0])
tensor([1.0000e-06, 1.0000e+00])
"""
import contextlib
import dataclasses
import math

import numpy as np

from .autograd import dtype as _dt
from .autograd._internal import array_of

__all__ = ["set_printoptions", "get_printoptions", "printoptions", "tensor_repr",
           "prints_as_tensor"]

# The classes that print as ``tensor(...)``, as PyTorch's Tensor and nn.Parameter do; any
# other subclass prints its own name. Both register (they are in the layers above this one).
_PLAIN = set()


def prints_as_tensor(cls):
    """Class decorator: instances of ``cls`` print as ``tensor(...)``."""
    _PLAIN.add(cls)
    return cls


@dataclasses.dataclass
class _PrinterOptions:
    precision: int = 4
    threshold: float = 1000
    edgeitems: int = 3
    linewidth: int = 80
    sci_mode: object = None


PRINT_OPTS = _PrinterOptions()

_PROFILES = {"default": (4, 1000, 3, 80), "short": (2, 1000, 2, 80),
             "full": (4, math.inf, 3, 80)}


def set_printoptions(precision=None, threshold=None, edgeitems=None, linewidth=None,
                     profile=None, sci_mode=None):
    """PyTorch's ``torch.set_printoptions``: ``profile`` is ``"default"``, ``"short"`` or
    ``"full"``; ``sci_mode`` True/False forces scientific notation on or off (None:
    chosen per tensor)."""
    if profile is not None:
        (PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems,
         PRINT_OPTS.linewidth) = _PROFILES[profile]
    if precision is not None:
        PRINT_OPTS.precision = precision
    if threshold is not None:
        PRINT_OPTS.threshold = threshold
    if edgeitems is not None:
        PRINT_OPTS.edgeitems = edgeitems
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    PRINT_OPTS.sci_mode = sci_mode


def get_printoptions():
    return dataclasses.asdict(PRINT_OPTS)


@contextlib.contextmanager
def printoptions(**kwargs):
    """Change the print options for the ``with`` block."""
    old = get_printoptions()
    set_printoptions(**kwargs)
    try:
        yield
    finally:
        set_printoptions(**old)


class _Formatter:
    """Decides the notation and width of every element of one (real) array."""

    def __init__(self, a):
        self.floating = a.dtype.kind == "f"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        flat = a.reshape(-1)
        if not self.floating:
            for value in flat.tolist():
                self.max_width = max(self.max_width, len(f"{value}"))
            return
        values = flat[np.isfinite(flat) & (flat != 0)]
        if values.size == 0:
            return
        magnitudes = np.abs(values.astype(np.float64))
        low, high = magnitudes.min(), magnitudes.max()
        self.int_mode = bool(np.all(values == np.ceil(values)))
        self.sci_mode = bool(high / low > 1000.0 or high > 1.0e8 or low < 1.0e-4) \
            if PRINT_OPTS.sci_mode is None else PRINT_OPTS.sci_mode
        p = PRINT_OPTS.precision
        for value in values.tolist():
            if self.sci_mode:
                width = len(f"{value:.{p}e}")
            elif self.int_mode:
                width = len(f"{value:.0f}") + 1  # the "." that marks a float
            else:
                width = len(f"{value:.{p}f}")
            self.max_width = max(self.max_width, width)

    def format(self, value):
        p = PRINT_OPTS.precision
        if self.floating:
            if self.sci_mode:
                text = f"{value:{self.max_width}.{p}e}"
            elif self.int_mode:
                text = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    text += "."
            else:
                text = f"{value:.{p}f}"
        else:
            text = f"{value}"
        return " " * (self.max_width - len(text)) + text


def _element(value, real, imag):
    if imag is None:
        return real.format(value)
    re = real.format(value.real)
    im = (imag.format(value.imag) + "j").lstrip()
    return re + im if im[0] in "+-" else re + "+" + im  # handles -0.0 and +0.0


def _vector(a, indent, summarize, real, imag):
    element_length = real.max_width + 2 + (imag.max_width + 1 if imag is not None else 0)
    per_line = max(1, math.floor((PRINT_OPTS.linewidth - indent) / element_length))
    edge = PRINT_OPTS.edgeitems
    if summarize and not edge:
        data = ["..."]
    elif summarize and a.shape[0] > 2 * edge:
        data = [_element(v, real, imag) for v in a[:edge].tolist()] + [" ..."] + \
            [_element(v, real, imag) for v in a[-edge:].tolist()]
    else:
        data = [_element(v, real, imag) for v in a.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(a, indent, summarize, real, imag):
    if a.ndim == 0:
        return _element(a.item(), real, imag)
    if a.ndim == 1:
        return _vector(a, indent, summarize, real, imag)
    edge = PRINT_OPTS.edgeitems
    if summarize and a.shape[0] > 2 * edge:
        slices = [_nested(a[i], indent + 1, summarize, real, imag) for i in range(edge)] + \
            ["..."] + [_nested(a[i], indent + 1, summarize, real, imag)
                       for i in range(a.shape[0] - edge, a.shape[0])]
    else:
        slices = [_nested(a[i], indent + 1, summarize, real, imag) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(slices) + "]"


def _summarized(a):
    """The elements a summarised print shows (what its formatter is fitted to)."""
    edge = PRINT_OPTS.edgeitems
    if a.ndim == 0:
        return a
    if a.ndim == 1:
        return np.concatenate((a[:edge], a[-edge:])) if a.shape[0] > 2 * edge else a
    if not edge:
        return np.empty((0,) * a.ndim, dtype=a.dtype)
    rows = list(range(edge)) + list(range(a.shape[0] - edge, a.shape[0])) \
        if a.shape[0] > 2 * edge else range(a.shape[0])
    return np.stack([_summarized(a[i]) for i in rows])


def _array_str(a, indent):
    if a.size == 0:
        return "[]"
    summarize = a.size > PRINT_OPTS.threshold
    if a.dtype == np.float16:
        a = a.astype(np.float32)
    shown = _summarized(a) if summarize else a
    if a.dtype.kind == "c":
        return _nested(a, indent, summarize, _Formatter(shown.real), _Formatter(shown.imag))
    return _nested(a, indent, summarize, _Formatter(shown), None)


def _add_suffixes(text, suffixes, indent, force_newline):
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if force_newline or last_line_len + len(suffix) + 2 > PRINT_OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
            force_newline = False
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(self):
    """``repr(tensor)``, as PyTorch's ``Tensor.__repr__``."""
    plain = type(self) in _PLAIN
    prefix = "tensor(" if plain else f"{type(self).__name__}("
    indent = len(prefix)
    default = _dt.get_default_dtype()
    has_default_dtype = self.dtype in (default, default.to_complex(), _dt.int64, _dt.bool)
    suffixes = []
    if self.is_sparse:
        data = array_of(self)
        suffixes.append(f"size={tuple(data.shape)}")
        suffixes.append(f"nnz={data.nnz}")
        if not has_default_dtype:
            suffixes.append(f"dtype={self.dtype!r}")
        parts = []
        for name, a in (("indices", data.indices), ("values", data.values)):
            body = _array_str(a, indent + len(name) + len("=tensor("))
            if a.size == 0:
                body += f", size={tuple(a.shape)}"
            parts.append(f"{name}=tensor({body})")
        text = (",\n" + " " * indent).join(parts)
        suffixes.append(f"layout={self.layout!r}")
    else:
        a = array_of(self)
        if a.size == 0:
            if a.ndim != 1:
                suffixes.append(f"size={tuple(a.shape)}")
            if self.dtype is not default:
                suffixes.append(f"dtype={self.dtype!r}")
            text = "[]"
        else:
            if not PRINT_OPTS.edgeitems:
                suffixes.append(f"size={tuple(a.shape)}")
            if not has_default_dtype:
                suffixes.append(f"dtype={self.dtype!r}")
            text = _array_str(a, indent)
    if self.grad_fn is not None:
        suffixes.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
    elif self.requires_grad:
        suffixes.append("requires_grad=True")
    return _add_suffixes(prefix + text, suffixes, indent, force_newline=self.is_sparse)
