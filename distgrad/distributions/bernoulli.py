"""``Bernoulli(probs=... | logits=...)``, as ``torch.distributions.Bernoulli``."""
import math

from . import constraints
from .exp_family import ExponentialFamily
from .utils import (batch_shape_of, broadcast_all, lazy_property, logits_to_probs,
                    probs_to_logits)
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Size
from ..nn.functional import binary_cross_entropy_with_logits
from ..ops.creation import arange as _arange
from ..ops.random import bernoulli as _bernoulli

__all__ = ["Bernoulli"]


class Bernoulli(ExponentialFamily):
    """0/1 outcomes; give exactly one of ``probs`` and ``logits`` (the other is derived)."""

    arg_constraints = {"probs": constraints.unit_interval, "logits": constraints.real}
    support = constraints.boolean
    has_enumerate_support = True
    _mean_carrier_measure = 0

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        given = probs if probs is not None else logits
        (self._param,) = broadcast_all(given)
        setattr(self, "probs" if probs is not None else "logits", self._param)
        super().__init__(batch_shape_of(self._param, given), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return self._expanded(Bernoulli, batch_shape, _instance, ("probs", "logits"))

    def _new(self, *args, **kwargs):
        return self._param.new(*args, **kwargs)

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        mode = (self.probs >= 0.5).to(self.probs.dtype)
        mode[self.probs == 0.5] = math.nan
        return mode

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    @lazy_property
    def logits(self):
        return probs_to_logits(self.probs, is_binary=True)

    @lazy_property
    def probs(self):
        return logits_to_probs(self.logits, is_binary=True)

    @property
    def param_shape(self):
        return self._param.size()

    def sample(self, sample_shape=Size()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            return _bernoulli(self.probs.expand(shape))

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = broadcast_all(self.logits, value)
        return -binary_cross_entropy_with_logits(logits, value, reduction="none")

    def entropy(self):
        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand=True):
        values = _arange(2, dtype=self._param.dtype)
        values = values.view((-1,) + (1,) * len(self._batch_shape))
        if expand:
            values = values.expand((-1,) + tuple(self._batch_shape))
        return values

    @property
    def _natural_params(self):
        return (self.probs.log() - (-self.probs).log1p(),)

    def _log_normalizer(self, x):
        return x.exp().log1p()
