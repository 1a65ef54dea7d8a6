"""Whole modules through ``distgrad.save``/``distgrad.load`` (the value codec): class by
reference plus state, rebuilt without running any code of the class; optimizer state_dicts
round trip too. Outputs and state_dicts are compared with PyTorch's ``torch.save(model)``
/ ``torch.load(weights_only=False)`` where torch is installed."""
import importlib
import io
import pickle
import sys
import threading

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")


def roundtrip(obj, lib=distgrad, **load_args):
    buf = io.BytesIO()
    lib.save(obj, buf)
    buf.seek(0)
    return lib.load(buf, **load_args)


LAYERS = {  # name -> (build(nn), input shape)
    "Linear": (lambda nn: nn.Linear(3, 4), (2, 3)),
    "Sequential": (lambda nn: nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Dropout(0.0),
                                            nn.Linear(5, 2)), (2, 3)),
    "Conv2d_BatchNorm2d": (lambda nn: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1),
                                                    nn.BatchNorm2d(3), nn.ReLU(),
                                                    nn.MaxPool2d(2), nn.Flatten()), (2, 2, 4, 4)),
    "LSTM": (lambda nn: nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True),
             (2, 5, 3)),
    "GRUCell": (lambda nn: nn.GRUCell(3, 4), (2, 3)),
    "LayerNorm": (lambda nn: nn.LayerNorm(3), (2, 3)),
    "TransformerEncoderLayer": (lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0,
                                                                      activation="gelu"),
                                (5, 2, 8)),
    "TransformerEncoder": (lambda nn: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2), (2, 5, 8)),
    "MultiheadAttention": (lambda nn: nn.MultiheadAttention(8, 2, batch_first=True), (2, 5, 8)),
}


def _forward(model, x):
    if isinstance(model, (distgrad.nn.MultiheadAttention,)) or \
            (torch is not None and isinstance(model, torch.nn.MultiheadAttention)):
        return model(x, x, x)[0]
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_come_back_whole(name):
    build, shape = LAYERS[name]
    model = build(distgrad.nn)
    model.train(name != "Conv2d_BatchNorm2d")  # eval mode travels too
    x = distgrad.randn(*shape)
    with distgrad.no_grad():
        _forward(model, x)  # BatchNorm: running statistics that differ from their start
    copy = roundtrip(model)
    assert type(copy) is type(model) and copy.training == model.training
    assert [type(m) for m in copy.modules()] == [type(m) for m in model.modules()]
    ours, theirs = model.state_dict(), copy.state_dict()
    assert list(ours) == list(theirs)
    for k in ours:
        assert ours[k] is not theirs[k]
        np.testing.assert_array_equal(ours[k].numpy(), theirs[k].numpy(), err_msg=k)
    for p in copy.parameters():
        assert type(p) is nn.Parameter and p.requires_grad and p.is_leaf and p.grad is None
    with distgrad.no_grad():
        np.testing.assert_allclose(_forward(copy, x).numpy(), _forward(model, x).numpy(),
                                   rtol=1e-6)


@needs_torch
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_saved_layer_has_what_torch_keeps(name):
    """torch.save(model) + torch.load(weights_only=False): same state_dict keys, modules and
    training flags, and the loaded model still computes and trains."""
    build, shape = LAYERS[name]
    ours, theirs = roundtrip(build(distgrad.nn)), roundtrip(build(torch.nn), torch,
                                                            weights_only=False)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [type(m).__name__ for m in ours.modules()] == \
        [type(m).__name__ for m in theirs.modules()]
    assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    _forward(ours, distgrad.randn(*shape)).sum().backward()
    assert all(p.grad is not None for p in ours.parameters())


def test_shared_parameters_and_modules_stay_shared():
    enc = nn.Embedding(5, 4)
    dec = nn.Linear(4, 5)
    dec.weight = enc.weight  # tied weights, as the word language model's --tied
    shared = nn.Linear(4, 4)
    model = nn.ModuleDict({"enc": enc, "dec": dec, "a": shared, "b": shared})
    model.extra = [shared, (enc.weight, {"w": dec.bias})]  # plain containers hold them too
    copy = roundtrip(model)
    assert copy["dec"].weight is copy["enc"].weight
    assert copy["a"] is copy["b"] and copy.extra[0] is copy["a"]
    assert copy.extra[1][0] is copy["enc"].weight and copy.extra[1][1]["w"] is copy["dec"].bias
    assert len(list(copy.parameters())) == len(list(model.parameters())) == 4


class Recorder(nn.Module):
    """Every constructor, setter and unpickling hook of this class records that it ran."""

    calls = []

    def __new__(cls, *args, **kwargs):
        cls.calls.append("__new__")
        return super().__new__(cls)

    def __init__(self, size=2):
        Recorder.calls.append("__init__")
        super().__init__()
        self.fc = nn.Linear(size, size)
        self.size = size
        self.frozen = nn.Parameter(distgrad.ones(size), requires_grad=False)
        self.register_buffer("steps", distgrad.zeros(1, dtype=distgrad.int64))
        self.register_buffer("cache", distgrad.ones(size), persistent=False)
        self.names = {"a": 1, "b": (2.5, "x", None)}
        self.activation = distgrad.tanh
        self.block = nn.Linear

    def __setattr__(self, name, value):
        Recorder.calls.append("__setattr__")
        super().__setattr__(name, value)

    def __setstate__(self, state):
        Recorder.calls.append("__setstate__")
        super().__setstate__(state)

    def forward(self, x):
        return self.activation(self.fc(x)) * self.frozen + self.cache


def test_loading_runs_no_code_of_the_class_and_restores_every_attribute():
    model = Recorder(3)
    Recorder.calls.clear()
    copy = roundtrip(model, allowed_modules=[__name__])
    assert Recorder.calls == []
    assert type(copy) is Recorder
    assert copy.size == 3 and copy.names == {"a": 1, "b": (2.5, "x", None)}
    assert copy.activation is distgrad.tanh and copy.block is nn.Linear
    assert not copy.frozen.requires_grad and type(copy.frozen) is nn.Parameter
    assert copy.steps.dtype == distgrad.int64
    assert "cache" not in copy.state_dict() and "steps" in copy.state_dict()
    x = distgrad.randn(2, 3)
    np.testing.assert_allclose(copy(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    copy.fc.weight.data.add_(1.0)  # parameters are writable, not views of the file
    opt = distgrad.optim.SGD(copy.parameters(), lr=0.1)
    copy(x).sum().backward()
    opt.step()


def test_user_classes_need_permission_and_nothing_is_imported(tmp_path, monkeypatch):
    buf = io.BytesIO()
    distgrad.save(Recorder(), buf)
    with pytest.raises(pickle.UnpicklingError, match=rf"not allowed.*weights_only=False.*"
                                                      rf"allowed_modules=\['{__name__}'\]"):
        distgrad.load(io.BytesIO(buf.getvalue()))
    assert type(distgrad.load(io.BytesIO(buf.getvalue()), weights_only=False)) is Recorder

    # a class of a module this process has not imported: weights_only=False does not import it
    (tmp_path / "unimported_models.py").write_text(
        "import distgrad\nclass Net(distgrad.nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.fc = distgrad.nn.Linear(2, 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    net = importlib.import_module("unimported_models").Net()
    saved = io.BytesIO()
    distgrad.save(net, saved)
    monkeypatch.delitem(sys.modules, "unimported_models")
    with pytest.raises(pickle.UnpicklingError, match="'unimported_models' is not imported"):
        distgrad.load(io.BytesIO(saved.getvalue()), weights_only=False)
    assert "unimported_models" not in sys.modules
    # naming the module is consent to import it
    loaded = distgrad.load(io.BytesIO(saved.getvalue()), allowed_modules=["unimported_models"])
    assert type(loaded).__name__ == "Net" and "unimported_models" in sys.modules


class Holder(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(2, 2))
        self.inner[0]._hook = value


@pytest.mark.parametrize("value,what", [(threading.Lock(), "lock"),
                                        (lambda x: x, "lambda"),
                                        (io.BytesIO(), "BytesIO")])
def test_an_attribute_that_cannot_travel_is_named(value, what):
    with pytest.raises(TypeError, match=rf"model\.inner\.0\._hook cannot be sent or saved.*{what}"):
        distgrad.save(Holder(value), io.BytesIO())


def test_hooks_do_not_travel():
    model = nn.Linear(2, 2)
    seen = []
    model.register_forward_hook(lambda m, i, o: seen.append(1))
    copy = roundtrip(model)
    copy(distgrad.ones(1, 2))
    model(distgrad.ones(1, 2))
    assert seen == [1] and not copy._forward_hooks


def test_classes_that_are_not_modules_or_not_allowed_are_refused():
    from distgrad import codec
    from distgrad.nn.modules.module_codec import MODULE_CODE
    import msgpack

    def forged(ref):  # a one-module tree whose class reference is `ref`
        record = [ref, True, {}, {}, [], {}, {}]
        body = msgpack.packb(msgpack.ExtType(MODULE_CODE, msgpack.packb([[record], []])))
        blob = msgpack.packb(["distgrad-checkpoint", 2, msgpack.packb([body, []])])
        return io.BytesIO(blob)

    with pytest.raises(RuntimeError, match="not an nn.Module class"):
        distgrad.load(forged("distgrad.optim.sgd:SGD"))
    with pytest.raises(pickle.UnpicklingError, match="module 'os' is not allowed"):
        distgrad.load(forged("os:system"))
    with pytest.raises(pickle.UnpicklingError, match="imported into 'os', not defined there"):
        distgrad.load(forged("os:system"), weights_only=False)
    with pytest.raises(RuntimeError, match="not an nn.Module class"):
        distgrad.load(forged("threading:Thread"), weights_only=False)
    with pytest.raises(pickle.UnpicklingError, match="malformed or private"):
        distgrad.load(forged("distgrad:__builtins__"))
    with pytest.raises(codec.CodecError, match="not accepted here"):
        codec.loads(codec.dumps(nn.Linear(1, 1)))  # no context: nothing resolves


OPTIMIZERS = {
    "SGD": dict(lr=0.1, momentum=0.9, nesterov=True),
    "Adam": dict(lr=0.01, amsgrad=True),
    "AdamW": dict(lr=0.01),
    "Adadelta": dict(lr=1.0),
    "Adagrad": dict(lr=0.1),
    "Adamax": dict(lr=0.01),
    "NAdam": dict(lr=0.01),
    "RAdam": dict(lr=0.01),
    "RMSprop": dict(lr=0.01, momentum=0.5, centered=True),
    "LBFGS": dict(lr=0.5, max_iter=3, history_size=2),
}


def _train(lib, name, init, steps, resume_at=None):
    model = lib.nn.Linear(3, 2)
    model.load_state_dict({k: lib.tensor(v) for k, v in init.items()})
    opt = getattr(lib.optim, name)(model.parameters(), **OPTIMIZERS[name])
    x = lib.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    for step in range(steps):
        if step == resume_at:  # start over from a checkpoint of the model and optimizer
            state = roundtrip({"model": model.state_dict(), "opt": opt.state_dict()}, lib)
            model = lib.nn.Linear(3, 2)
            model.load_state_dict(state["model"])
            opt = getattr(lib.optim, name)(model.parameters(), **OPTIMIZERS[name])
            opt.load_state_dict(state["opt"])

        def closure():
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            return loss
        opt.step(closure)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, opt.state_dict()


@needs_torch
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_state_round_trips_through_save_and_load(name):
    init = {"weight": np.array([[0.3, -0.2, 0.1], [0.5, 0.4, -0.6]], np.float32),
            "bias": np.array([0.1, -0.1], np.float32)}
    resumed, state = _train(distgrad, name, init, 4, resume_at=2)
    theirs, their_state = _train(torch, name, init, 4, resume_at=2)
    for k in init:
        np.testing.assert_allclose(resumed[k], theirs[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert state["param_groups"][0].keys() >= {k for k in their_state["param_groups"][0]
                                               if k in OPTIMIZERS[name] or k == "params"}
    assert list(state["state"]) == list(their_state["state"])
    for i in state["state"]:
        assert set(state["state"][i]) == set(their_state["state"][i]), (name, i)
