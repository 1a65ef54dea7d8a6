"""Checkpointing inside offloading hooks: what a checkpointed block saves stays with the
checkpoint (recomputed), its input is saved like any tensor, so the offloading hooks
move it out; backward reads it back to rerun the block. Gradients stay bit for bit."""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.offload import OffloadPolicy, save_on_disk
from distgrad.utils.checkpoint import checkpoint

pytestmark = pytest.mark.timeout(60)


def _model():
    distgrad.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(32, 32), nn.Tanh())])


def _grads(model, x):
    return [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]


def _step(model, x, hooks=None, blocks=False, reentrant=False):
    for p in model.parameters():
        p.grad = None
    x.grad = None
    layers = list(model)
    with hooks if hooks is not None else distgrad.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t):
        h = x
        for i in range(0, len(layers), 2):
            block = nn.Sequential(*layers[i:i + 2])
            h = checkpoint(block, h, use_reentrant=reentrant) if blocks else block(h)
    h.pow(2).sum().backward()
    return _grads(model, x)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_offload_only_their_inputs(tmp_path, reentrant):
    model = _model()
    x = distgrad.tensor(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32),
                        requires_grad=True)
    plain = _step(model, x)
    with save_on_disk(tmp_path, policy=OffloadPolicy(min_bytes=0)) as hooks:
        pass
    offloaded = _step(model, x, hooks)
    everything = hooks.stats.tensors_offloaded
    hooks.close()
    with save_on_disk(tmp_path, policy=OffloadPolicy(min_bytes=0)) as hooks:
        pass
    both = _step(model, x, hooks, blocks=True, reentrant=reentrant)
    stats = hooks.stats
    hooks.close()
    for got in (offloaded, both):
        for g, w in zip(got, plain):
            assert (g == w).all()
    # the inputs of blocks 2, 3 and 4 (block 1's is the leaf x, which stays); reentrant
    # saves them with ctx.save_for_backward, also under the hooks
    assert stats.tensors_offloaded == 3 < everything
    assert stats.prefetch_hits + stats.prefetch_misses == 3   # each read back once
    assert not list(tmp_path.glob("distgrad-offload-*/*"))    # and freed
