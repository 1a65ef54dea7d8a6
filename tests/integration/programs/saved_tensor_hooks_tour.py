"""What autograd saves for backward, and the ways ``saved_tensors_hooks`` can change it.

A tour in the order of PyTorch's saved-tensors-hooks tutorial, each step checked:
the ``_saved_*`` attributes of a ``grad_fn`` (an input is saved as itself, an output as
an equal tensor); ``torch.autograd.graph.saved_tensors_hooks`` with pack/unpack pairs
that log, that transform (scale and unscale), that return an int index into a list, a
tuple with a closure, or a string (``repr`` and back); a CPU pack hook; ``save_on_cpu``
used inside one module's ``forward`` and as a wrapper module; saving to files with
``torch.save``/``torch.load`` (a second access to a saved tensor whose file the first
unpack deleted must fail); and a wrapper that writes only large tensors to files that
delete themselves when the graph lets go of them. Inputs and weights come from a seeded
NumPy generator. Plain PyTorch.
"""
import json
import os
import tempfile
import uuid

import numpy as np
import torch
from torch import nn

draw = np.random.default_rng(31)
found = {}


def normal(*shape, grad=False):
    return torch.from_numpy(draw.standard_normal(shape).astype(np.float32)).requires_grad_(grad)


# -------------------------------------------------------------- what a node keeps
u, v = normal(4, grad=True), normal(4, grad=True)
product = u * v
found["inputs_kept_as_themselves"] = [product.grad_fn._saved_self is u,
                                      product.grad_fn._saved_other is v]
w = normal(4, grad=True)
grown = torch.exp(w)
found["output_kept"] = [grown.grad_fn._saved_result.equal(grown),
                        grown.grad_fn._saved_result is grown]

# -------------------------------------------------------------------- logging hooks
packs, unpacks = [], []


def log_pack(t):
    packs.append(t.tolist())
    return t


def log_unpack(t):
    unpacks.append(t.tolist())
    return t


u = torch.full((3,), 2.0, requires_grad=True)
v = torch.arange(3.0, requires_grad=True) + 1
with torch.autograd.graph.saved_tensors_hooks(log_pack, log_unpack):
    product = u * v
product.sum().backward()
found["logged"] = [packs, sorted(unpacks)]  # the order of unpacking is not part of the contract

# -------------------------------------------------------- hooks that change the value
x = normal(6, grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t * 8, lambda t: t / 8):
    cubed = x.pow(3)
cubed.sum().backward()
found["scaled_round_trip"] = bool(torch.allclose(x.grad, 3 * x * x))

shelf = []


def shelve(t):
    shelf.append(t)
    return len(shelf) - 1


x = normal(6, grad=True)
with torch.autograd.graph.saved_tensors_hooks(shelve, lambda index: shelf[index]):
    squared = x * x
squared.sum().backward()
found["by_index"] = [len(shelf), bool(x.grad.equal(2 * x))]


def pack_with_key(t):
    key = normal(*t.shape)
    return t + key, lambda hidden: hidden - key


x = normal(6, grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack_with_key, lambda packed: packed[1](packed[0])):
    squared = x * x
squared.sum().backward()
found["with_closure"] = bool(torch.allclose(x.grad, 2 * x, atol=1e-6))

x = normal(6, grad=True)
with torch.autograd.graph.saved_tensors_hooks(repr, lambda text: eval("torch." + text)):
    squared = x * x
squared.sum().backward()
found["as_text"] = [bool((x.grad - 2 * x).abs().max() < 1e-3), x.grad.tolist()]


# ----------------------------------------------------------------- keeping it on the CPU
def to_cpu(t):
    return t.device, t.cpu()


def back_to_device(packed):
    device, t = packed
    return t.to(device)


x = normal(6, grad=True)
with torch.autograd.graph.saved_tensors_hooks(to_cpu, back_to_device):
    squared = x * x
squared.sum().backward()
found["cpu_hooks"] = bool(torch.allclose(x.grad, 2 * x))


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(normal(6))

    def forward(self, x):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return torch.tanh(self.scale * x)


gate = Gate()
gate(normal(6)).sum().backward()
found["save_on_cpu_in_forward"] = gate.scale.grad.tolist()


class OnCpu(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return self.inner(*args, **kwargs)


stack = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), OnCpu(nn.Linear(32, 32)), nn.Linear(32, 2))
with torch.no_grad():
    for p in stack.parameters():
        p.copy_(normal(*p.shape) * 0.2)
stack(normal(3, 8)).pow(2).sum().backward()
found["save_on_cpu_wrapper"] = [p.grad.sum().item() for p in stack.parameters()]

# -------------------------------------------------------------------- saving to files
spool = tempfile.TemporaryDirectory()


def to_file(t):
    path = os.path.join(spool.name, uuid.uuid4().hex)
    torch.save(t, path)
    return path


def from_file(path):
    t = torch.load(path)
    os.remove(path)  # read once: the file goes
    return t


x = torch.full((4,), 3.0, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(to_file, from_file):
    squared = x.pow(2)
first = squared.grad_fn._saved_self.tolist()
try:
    squared.grad_fn._saved_self
    found["second_access"] = "worked"
except Exception:  # the file is gone
    found["second_access"] = "failed"
found["first_access"] = first


class TempFile:
    """A file name whose file is removed together with this object."""

    def __init__(self):
        self.name = os.path.join(spool.name, uuid.uuid4().hex)

    def __del__(self):
        os.remove(self.name)


LARGE = 500
to_disk = []


def park_if_large(t):
    if t.numel() < LARGE:
        return t
    handle = TempFile()
    torch.save(t, handle.name)
    to_disk.append(t.numel())
    return handle


def fetch(stored):
    return stored if isinstance(stored, torch.Tensor) else torch.load(stored.name)


class LargeToDisk(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(park_if_large, fetch):
            return self.inner(*args, **kwargs)


net = LargeToDisk(nn.Sequential(nn.Linear(30, 40), nn.Sigmoid(), nn.Linear(40, 5)))
with torch.no_grad():
    for p in net.parameters():
        p.copy_(normal(*p.shape) * 0.3)
before = len(os.listdir(spool.name))
loss = net(normal(25, 30)).pow(2).sum()
while_alive = len(os.listdir(spool.name)) - before
loss.backward()
del loss
# how many tensors are large enough differs between libraries (which operands a linear
# layer saves), so only "some, each with its file, all gone at the end" is compared
found["large_to_disk"] = {"files_match": while_alive > 0 and while_alive == len(to_disk),
                          "left_after": len(os.listdir(spool.name)) - before,
                          "grads": [p.grad.sum().item() for p in net.parameters()]}
print("RESULT " + json.dumps(found))
