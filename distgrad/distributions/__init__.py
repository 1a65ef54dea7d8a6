"""``distgrad.distributions``: probability distributions with gradients, as
``torch.distributions``: ``Normal``, ``Uniform`` (both reparameterised: ``rsample``),
``Bernoulli``, ``Categorical``, ``kl_divergence`` between them, and the
``constraints`` that validate parameters and samples.

>>> import distgrad
>>> from distgrad.distributions import Categorical
>>> distgrad.manual_seed(0)  # doctest: +ELLIPSIS
<...>
>>> Categorical(logits=distgrad.zeros(4)).sample((3,)).shape
distgrad.Size([3])
"""
from . import constraints
from .bernoulli import Bernoulli
from .categorical import Categorical
from .distribution import Distribution
from .exp_family import ExponentialFamily
from .kl import kl_divergence, register_kl
from .normal import Normal
from .uniform import Uniform

__all__ = ["Bernoulli", "Categorical", "Distribution", "ExponentialFamily", "Normal", "Uniform",
           "constraints", "kl_divergence", "register_kl"]
