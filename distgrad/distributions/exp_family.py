"""``ExponentialFamily``: distributions whose density is ``exp(<t(x), theta> - F(theta) + k(x))``."""
from .distribution import Distribution
from ..autograd import grad

__all__ = ["ExponentialFamily"]


class ExponentialFamily(Distribution):
    """Subclasses give ``_natural_params``, ``_log_normalizer`` and ``_mean_carrier_measure``;
    the entropy then follows by differentiating the log normaliser (Bregman divergence)."""

    @property
    def _natural_params(self):
        raise NotImplementedError

    def _log_normalizer(self, *natural_params):
        raise NotImplementedError

    @property
    def _mean_carrier_measure(self):
        raise NotImplementedError

    def entropy(self):
        result = -self._mean_carrier_measure
        nparams = [p.detach().requires_grad_() for p in self._natural_params]
        lg_normal = self._log_normalizer(*nparams)
        gradients = grad(lg_normal.sum(), nparams, create_graph=True)
        result = result + lg_normal
        for nparam, g in zip(nparams, gradients):
            result = result - (nparam * g).reshape(tuple(self._batch_shape) + (-1,)).sum(-1)
        return result
