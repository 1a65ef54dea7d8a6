"""A training program written for PyTorch runs on distgrad with only the import swapped.

The same source text runs twice, once with ``torch`` bound to PyTorch and once to
distgrad, from the same initial weights; parameters must agree after training.
"""
import io

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch as real_torch

PROGRAM = '''
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 16), torch.nn.GELU())
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.norm(self.body(x)))


def train(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=1e-4)
    seen = []
    handle = model.head.register_full_backward_hook(
        lambda mod, gin, gout: seen.append(float(gout[0].abs().sum())))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.05)
    for step in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
    handle.remove()
    with torch.no_grad():
        final = loss_fn(model(x), y).item()
    return final, seen
'''


def _run(module, init, x, y, steps=8):
    scope = {"torch": module}
    exec(PROGRAM, scope)  # noqa: S102 - our own test program text
    model = scope["Net"]()
    model.load_state_dict({k: module.tensor(v) for k, v in init.items()})
    final, seen = scope["train"](model, module.tensor(x), module.tensor(y), steps)
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    module.save(model.state_dict(), buf)
    buf.seek(0)
    model.load_state_dict(module.load(buf))
    return final, seen, params


@pytest.mark.skipif(real_torch is None, reason="PyTorch (the oracle) is not installed")
def test_same_program_same_result():
    probe = {"torch": distgrad}
    exec(PROGRAM, probe)  # noqa: S102
    init = {k: v.detach().numpy().copy() for k, v in probe["Net"]().state_dict().items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 6)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    ours = _run(distgrad, init, x, y)
    theirs = _run(real_torch, init, x, y)
    assert abs(ours[0] - theirs[0]) < 1e-4
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-4)
    for k in init:
        np.testing.assert_allclose(ours[2][k], theirs[2][k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_program_runs_without_torch():
    probe = {"torch": distgrad}
    exec(PROGRAM, probe)  # noqa: S102
    x = distgrad.randn(16, 6)
    y = distgrad.randint(0, 3, (16,))
    model = probe["Net"]()
    first = distgrad.nn.CrossEntropyLoss()(model(x), y).item()
    final, seen = probe["train"](model, x, y, 20)
    assert final < first and len(seen) == 20


def test_checkpoints_hold_data_only(tmp_path):
    pytest.importorskip("msgpack", reason="checkpoints use the value codec (msgpack)")
    path = tmp_path / "ckpt.dgt"
    state = {"w": distgrad.ones(2, 3, requires_grad=True), "step": 3, "betas": (0.9, 0.99)}
    distgrad.save(state, path)
    back = distgrad.load(path)
    assert back["step"] == 3 and back["betas"] == (0.9, 0.99)
    assert back["w"].equal(state["w"]) and back["w"].requires_grad
    back["w"].data.add_(1)  # loaded tensors own writable memory
    with pytest.raises(TypeError, match="distgrad.save: object of type builtins.object"):
        distgrad.save({"f": object()}, tmp_path / "bad.dgt")
    with pytest.raises(TypeError, match="cannot be sent or saved"):
        distgrad.save({"f": print}, tmp_path / "func.dgt")  # functions never enter a file
    (tmp_path / "junk.dgt").write_bytes(b"\x80\x04not a checkpoint")
    with pytest.raises(Exception, match="not a distgrad checkpoint"):
        distgrad.load(tmp_path / "junk.dgt")
