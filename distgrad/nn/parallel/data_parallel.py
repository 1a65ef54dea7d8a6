"""``nn.DataParallel`` where there is no accelerator: the module runs as it is.

PyTorch's DataParallel replicates a module over GPUs; on a machine without an
accelerator (distgrad's CPU) PyTorch's own keeps the module, records no devices
(``device_ids == []``) and calls the module directly, ignoring ``device_ids``. This is
that behaviour: same wrapping (``state_dict`` keys under ``module.``), same results.
For data parallelism over processes, see ``DistributedDataParallel``.

>>> import distgrad
>>> net = DataParallel(distgrad.nn.Linear(3, 2))
>>> net(distgrad.ones(4, 3)).shape, net.device_ids
(distgrad.Size([4, 2]), [])
"""
from ..modules.module import Module

__all__ = ["DataParallel", "data_parallel"]


class DataParallel(Module):
    """Runs ``module`` directly (no accelerator to replicate it on), as PyTorch on CPU."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        super().__init__()
        self.module = module
        self.device_ids = []

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


def data_parallel(module, inputs, device_ids=None, output_device=None, dim=0,
                  module_kwargs=None):
    """PyTorch's functional form needs an accelerator; without one it raises, as PyTorch's."""
    raise RuntimeError("device type could not be determined")
