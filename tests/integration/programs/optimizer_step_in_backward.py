"""Fusing the optimizer step into the backward pass with post-accumulate-grad hooks.

Port of pytorch/tutorials `intermediate_source/optimizer_step_in_backward_tutorial.py`:
a training loop with `Adam`, then the same training with one `Adam` per parameter run
by `Tensor.register_post_accumulate_grad_hook` as soon as that parameter's gradient is
accumulated (and dropped right after), which must train the same weights. Changes: a
small MLP on the CPU instead of torchvision's ViT-L/16 on a GPU, its weights and the
fake images from a seeded NumPy generator (the tutorial's `torch.rand`), and no CUDA
memory snapshots; instead the run reports the weights both ways and whether any
gradient was left behind by the fused version. Plain PyTorch.
"""
import json

import numpy as np
import torch
import torch.nn as nn

IMAGE_SIZE = 8
rng = np.random.default_rng(0)
images = [torch.from_numpy(rng.random((1, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32))
          for _ in range(3)]


def make_model():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, 32), nn.GELU(),
                          nn.LayerNorm(32), nn.Linear(32, 10))
    init = np.random.default_rng(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(init.uniform(-0.1, 0.1, tuple(p.shape)).astype(np.float32)))
    return model


model = make_model()
optimizer = torch.optim.Adam(model.parameters())
step = iter(range(1000))


def train(model, optimizer):
    # create our fake image input: tensor shape is batch_size, channels, height, width
    fake_image = images[next(step) % 3]

    # call our forward and backward
    loss = model.forward(fake_image)
    loss.sum().backward()

    # optimizer update
    optimizer.step()
    optimizer.zero_grad()


# train 3 steps
for _ in range(3):
    train(model, optimizer)
plain = [p.detach().sum().item() for p in model.parameters()]

model = make_model()
step = iter(range(1000))

# Instead of having just *one* optimizer, we will have a ``dict`` of optimizers
# for every parameter so we could reference them in our hook.
optimizer_dict = {p: torch.optim.Adam([p], foreach=False) for p in model.parameters()}


# Define our hook, which will call the optimizer ``step()`` and ``zero_grad()``
def optimizer_hook(parameter) -> None:
    optimizer_dict[parameter].step()
    optimizer_dict[parameter].zero_grad()


# Register the hook onto every parameter
for p in model.parameters():
    p.register_post_accumulate_grad_hook(optimizer_hook)


# Now remember our previous ``train()`` function? Since the optimizer has been
# fused into the backward, we can remove the optimizer step and zero_grad calls.
def train(model):
    # create our fake image input: tensor shape is batch_size, channels, height, width
    fake_image = images[next(step) % 3]

    # call our forward and backward
    loss = model.forward(fake_image)
    loss.sum().backward()

    # optimizer update --> no longer needed!
    # optimizer.step()
    # optimizer.zero_grad()


# delete optimizer memory from before to get a clean slate
del optimizer

# train 3 steps. note that we no longer pass the optimizer into train()
for _ in range(3):
    train(model)
fused = [p.detach().sum().item() for p in model.parameters()]
print("RESULT " + json.dumps({"plain": plain, "fused": fused,
                              "grads_left": [p.grad is not None for p in model.parameters()],
                              "steps": [optimizer_dict[p].state[p]["step"].item()
                                        for p in model.parameters()]}))
