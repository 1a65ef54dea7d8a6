"""``nn.DataParallel`` without an accelerator runs the module as it is, as PyTorch's does."""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch


def _run(m):
    m.manual_seed(0)
    inner = m.nn.Sequential(m.nn.Linear(3, 4), m.nn.ReLU(), m.nn.Linear(4, 2))
    with m.no_grad():
        for i, p in enumerate(inner.parameters()):
            p.copy_(m.tensor(np.linspace(-1, 1, p.numel()).reshape(tuple(p.shape)) * (i + 1),
                             dtype=m.float32))
    net = m.nn.DataParallel(inner, device_ids=[0, 1])
    x = m.tensor(np.arange(12.0).reshape(4, 3) / 10, dtype=m.float32)
    out = net(x)
    out.sum().backward()
    return {"out": out.detach().numpy().tolist(), "keys": list(net.state_dict()),
            "device_ids": net.device_ids, "has_dim": hasattr(net, "dim"),
            "grads": [p.grad.numpy().tolist() for p in net.parameters()],
            "is_module": isinstance(net, m.nn.Module), "same": net.module is inner,
            "repr": repr(net).replace("torch.", "distgrad.")}


def test_data_parallel_is_the_module_itself():
    ours = _run(distgrad)
    assert ours["keys"][0] == "module.0.weight" and ours["device_ids"] == [] and ours["same"]
    if torch is not None:
        theirs = _run(torch)
        for key in ("keys", "device_ids", "has_dim", "is_module", "same", "repr"):
            assert ours[key] == theirs[key], key
        np.testing.assert_allclose(ours["out"], theirs["out"], rtol=1e-6)
        for a, b in zip(ours["grads"], theirs["grads"]):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_functional_data_parallel_needs_an_accelerator():
    from distgrad.nn.parallel import data_parallel
    with pytest.raises(RuntimeError, match="device type could not be determined"):
        data_parallel(distgrad.nn.Linear(2, 2), distgrad.ones(1, 2))
    if torch is not None:
        with pytest.raises(RuntimeError, match="device type could not be determined"):
            torch.nn.parallel.data_parallel(torch.nn.Linear(2, 2), torch.ones(1, 2))
