"""Helpers of the offloading tests: small models, reference gradients, store clients."""
import gc

import numpy as np
import distgrad
from distgrad import nn


def make_mlp(width=32, layers=3, seed=0):
    distgrad.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.Tanh())])


def gradients(model_fn, hooks=None, retain_graph=False, batch=8, seed=1):
    """Parameter gradients of ``model_fn()`` on a fixed batch, under ``hooks`` (or none)."""
    model = model_fn()
    distgrad.manual_seed(seed)
    x = distgrad.randn(batch, model[0].in_features)
    if hooks is None:
        loss = model(x).pow(2).mean()
    else:
        with hooks:
            loss = model(x).pow(2).mean()
    loss.backward(retain_graph=retain_graph)
    if retain_graph:
        loss.backward()
    out = [p.grad.numpy().copy() for p in model.parameters()]
    del loss
    gc.collect()
    return out


def assert_bitwise_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))


def fast_client(endpoint, **kwargs):
    from distgrad.offload.store import StoreClient
    kwargs.setdefault("heartbeat_interval", 0.1)
    kwargs.setdefault("heartbeat_timeout", 0.8)
    kwargs.setdefault("timeout", 10.0)
    return StoreClient(endpoint, **kwargs)
