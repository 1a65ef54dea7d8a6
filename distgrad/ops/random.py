"""Random sampling: the in-place fills (``random_``, ``uniform_``, ``normal_``,
``bernoulli_``, ``exponential_``) and the samplers ``bernoulli`` and ``multinomial``.

All draw from ``distgrad``'s generator (``distgrad.manual_seed``) or the one passed as
``generator=``. A fill gives the tensor a new history with a zero gradient, as in
PyTorch (the values no longer depend on what was there before).
"""
import numpy as np

from ..autograd.tensor import TensorBase
from .creation import _rng
from .fused import scalar_type_name
from ..autograd._internal import apply_inplace, array_of, wrap, defop, record

__all__ = ["bernoulli", "multinomial"]


def _zero_grad(xp, g, m):
    return g * 0


_FILL_NODES = {name: defop(name, vjps=(_zero_grad,)) for name in
               ("RandomBackward0", "UniformBackward0", "NormalBackward0", "BernoulliBackward1",
                "BernoulliBackward2", "ExponentialBackward0")}


def _fill_with(self, node_name, draw):
    """Replace ``self``'s values in place by ``draw(shape)`` (an ndarray)."""
    def fill(t):
        d = array_of(t)
        return record(_FILL_NODES[node_name], np.asarray(draw(d.shape)).astype(d.dtype), (t,))
    return apply_inplace(self, fill)


def _largest_exact_integer(dtype):
    """``random_()``'s inclusive upper bound: every integer up to it fits the dtype exactly."""
    if dtype.kind == "b":
        return 1
    if dtype.kind == "f":
        return 2 ** (np.finfo(dtype).nmant + 1)
    return int(np.iinfo(dtype).max)


def random_(self, *bounds, generator=None):
    """``random_(from, to)``: integers uniform in ``[from, to)``; ``random_(to)`` from 0;
    ``random_()`` from 0 to the largest integer the dtype holds exactly."""
    if len(bounds) > 2:
        raise TypeError(f"random_() takes at most 2 positional arguments ({len(bounds)} given)")
    low, high = (0, None) if not bounds else (0, bounds[0]) if len(bounds) == 1 else bounds
    if high is None:
        high = _largest_exact_integer(array_of(self).dtype) + 1
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= "
                           f"to={high}")
    rng = _rng(generator)
    return _fill_with(self, "RandomBackward0",
                      lambda shape: rng.integers(low, high - 1, size=shape, endpoint=True))


def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_}"
                           f" > to={to}")
    rng = _rng(generator)
    return _fill_with(self, "UniformBackward0", lambda shape: rng.uniform(from_, to, shape))


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    rng = _rng(generator)
    return _fill_with(self, "NormalBackward0", lambda shape: rng.normal(mean, std, shape))


def exponential_(self, lambd=1.0, *, generator=None):
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    rng = _rng(generator)
    return _fill_with(self, "ExponentialBackward0",
                      lambda shape: rng.exponential(1.0 / lambd, shape))


def _draw_bernoulli(p, shape, generator):
    return _rng(generator).random(shape) < p


def bernoulli_(self, p=0.5, *, generator=None):
    """Each element 1 with probability ``p`` (a number or a tensor broadcast to ``self``)."""
    if isinstance(p, TensorBase):
        probs = array_of(p)
        if probs.size and (probs.min() < 0 or probs.max() > 1):
            raise RuntimeError("bernoulli_ expects p to be in [0, 1]")
        return _fill_with(self, "BernoulliBackward2",
                          lambda shape: _draw_bernoulli(probs, shape, generator))
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    return _fill_with(self, "BernoulliBackward1", lambda shape: _draw_bernoulli(p, shape, generator))


def bernoulli(input, p=None, *, generator=None):
    """0/1 samples, each 1 with the probability in ``input`` (or with ``p`` if given).

    >>> import distgrad
    >>> distgrad.bernoulli(distgrad.tensor([0.0, 1.0])).tolist()
    [0.0, 1.0]
    """
    probs = array_of(input)
    if p is not None:
        return bernoulli_(wrap(np.empty_like(probs)), p, generator=generator)
    if probs.size and not (probs.min() >= 0 and probs.max() <= 1):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
    return wrap(_draw_bernoulli(probs, probs.shape, generator).astype(probs.dtype))


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """Category indices drawn from each row of (unnormalised) probabilities ``input``.

    Without replacement a category is drawn at most once per row: the ``num_samples``
    smallest of ``E_i / p_i`` with ``E_i`` standard exponential (the Efraimidis-Spirakis
    scheme), all rows at once.

    >>> import distgrad
    >>> distgrad.multinomial(distgrad.tensor([0.0, 1.0, 0.0]), 2, replacement=True).tolist()
    [1, 1]
    """
    probs = array_of(input)
    if probs.dtype.kind != "f":
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{scalar_type_name(probs.dtype)}")
    if probs.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    rows = probs.reshape(-1, probs.shape[-1]).astype(np.float64)
    n_categories = rows.shape[1]
    if not replacement and num_samples > n_categories:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    totals = rows.sum(axis=1)
    if np.any(totals <= 0):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    rng = _rng(generator)
    if replacement:
        # Inverse CDF for every row in one search: row r's CDF is shifted by r.
        cdf = np.cumsum(rows / totals[:, None], axis=1)
        cdf[:, -1] = 1.0
        offsets = np.arange(len(rows))[:, None]
        u = rng.random((len(rows), num_samples)) + offsets
        picks = np.searchsorted((cdf + offsets).ravel(), u.ravel(), side="right")
        picks = picks.reshape(u.shape) - offsets * n_categories
        picks = np.minimum(picks, n_categories - 1)
    else:
        # Zero-probability categories come last (key inf), only when the others run out.
        with np.errstate(divide="ignore"):
            keys = rng.standard_exponential(rows.shape) / rows
        picks = np.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    return wrap(picks.reshape(probs.shape[:-1] + (num_samples,)).astype(np.int64))
