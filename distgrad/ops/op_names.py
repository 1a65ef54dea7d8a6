"""The ops the profiler sees, under PyTorch's names (``aten::mm``, ``aten::add_``).

:func:`install` wraps the public functions of the op modules with
:func:`~distgrad.autograd.profiling.observed` before they are installed as Tensor
methods and re-exported as ``distgrad.*``, so every way of calling an op (function,
method, operator) records one event named as PyTorch records it; the wrapper costs one
check of a global when nothing is profiled. An op's name is ``aten::<function name>``
unless :data:`RENAMED` says otherwise; helpers, classes and constants are left alone.
Calls between op modules bound at import time (``from .arithmetic import mul`` inside
``ops``) stay unwrapped: their time counts as the calling op's own, as a fused kernel's.
"""
from ..autograd._internal import observed
from . import (arithmetic, attention, batchnorm, channel_dropout, complex as complex_ops, conv,
               conv_transpose, conversion, creation, diag, einsum, embedding_bag, erf, indexing,
               inplace, layer_norm, linalg, pooling, random, reduction, scatter, shape, softmax,
               unary)

__all__ = ["install", "observe", "RENAMED"]

# op modules, and the names in their __all__ that are not ops
_MODULES = {
    arithmetic: (),
    attention: ("attention", "causal_bias"),
    batchnorm: (),
    channel_dropout: (),
    complex_ops: ("is_complex", "is_floating_point"),
    conv: ("expand_param", "pad_trailing", "window_view", "convolution_map", "input_grad_map",
           "weight_grad_map", "check_operands", "expand_positive"),
    conv_transpose: (),
    conversion: (),
    creation: ("tensor", "as_tensor", "from_numpy", "manual_seed", "seed", "initial_seed",
               "Generator", "default_generator", "get_rng_state", "set_rng_state"),
    diag: ("install",),
    einsum: (),
    embedding_bag: (),
    erf: (),
    indexing: ("getitem",),  # its PyTorch op depends on the key (select, slice, index)
    inplace: (),
    layer_norm: (),
    linalg: (),
    pooling: ("pool_output_size",),
    random: (),
    reduction: (),
    scatter: (),
    shape: ("numel",),
    softmax: (),
    unary: (),
}
# ops outside their module's __all__ (the in-place random fills, installed as methods)
_EXTRA = {random: ("random_", "uniform_", "normal_", "exponential_", "bernoulli_")}
# where PyTorch's op name is not aten::<function name>
RENAMED = {"index_put": "aten::index_put_", "conv_transpose": "aten::convolution",
           "convolution": "aten::convolution",
           "layer_norm": "aten::native_layer_norm"}  # (nn.functional's is aten::layer_norm)


def observe(module, names):
    """Wrap ``module``'s functions ``names`` (an iterable, or ``{name: op name}``) for the
    profiler, in place. Higher layers use it for their own ops (``nn.functional``)."""
    items = names.items() if isinstance(names, dict) else \
        ((n, RENAMED.get(n, f"aten::{n}")) for n in names)
    for name, op_name in items:
        fn = getattr(module, name)
        if getattr(fn, "__profiler_name__", None) is None and callable(fn):
            setattr(module, name, observed(op_name, fn))


def install():
    """Wrap every op of the op modules (once, before they become Tensor methods)."""
    for module, not_ops in _MODULES.items():
        names = [n for n in module.__all__ if n not in not_ops and not isinstance(
            getattr(module, n), type)] + list(_EXTRA.get(module, ()))
        observe(module, names)
