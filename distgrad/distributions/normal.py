"""``Normal(loc, scale)``, as ``torch.distributions.Normal`` (reparameterised)."""
import math

from . import constraints
from .exp_family import ExponentialFamily
from .utils import batch_shape_of, broadcast_all
from ..autograd.grad_mode import no_grad
from ..autograd.tensor import Size
from ..ops.creation import normal as _normal, randn as _randn
from ..ops.unary import erf as _erf

__all__ = ["Normal"]


class Normal(ExponentialFamily):
    """
    >>> import distgrad
    >>> d = Normal(distgrad.tensor([0.0]), distgrad.tensor([2.0]))
    >>> round(d.log_prob(distgrad.tensor([0.0])).item(), 4)
    -1.6121
    """

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = broadcast_all(loc, scale)
        super().__init__(batch_shape_of(self.loc, loc, scale), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return self._expanded(Normal, batch_shape, _instance, ("loc", "scale"))

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.stddev.pow(2)

    def sample(self, sample_shape=Size()):
        shape = self._extended_shape(sample_shape)
        with no_grad():
            return _normal(self.loc.expand(shape), self.scale.expand(shape), dtype=self.loc.dtype)

    def rsample(self, sample_shape=Size()):
        shape = self._extended_shape(sample_shape)
        eps = _randn(*shape, dtype=self.loc.dtype)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        var = self.scale ** 2
        return -((value - self.loc) ** 2) / (2 * var) - self.scale.log() \
            - math.log(math.sqrt(2 * math.pi))

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + _erf((value - self.loc) * self.scale.reciprocal() / math.sqrt(2)))

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()

    @property
    def _natural_params(self):
        return (self.loc / self.scale.pow(2), -0.5 * self.scale.pow(2).reciprocal())

    def _log_normalizer(self, x, y):
        return -0.25 * x.pow(2) / y + 0.5 * (-math.pi / y).log()
