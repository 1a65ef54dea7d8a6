"""``distgrad.utils``: helpers of processes, files and threads, ``hooks``; and ``data``
(``torch.utils.data``), which loads on first use so that ``import distgrad`` stays cheap."""
from .lazy import submodules_on_first_use

__getattr__ = submodules_on_first_use(__name__)
