"""Hooks for autograd saved tensors: the PyTorch tutorial, run section by section.

Port of pytorch/tutorials `intermediate_source/autograd_saved_tensors_hooks_tutorial.py`:
every code cell, in order, with what it printed or asserted recorded for the RESULT
line. Changes: inputs from a seeded NumPy generator instead of `torch.randn`; the
tensors the hooks see, the packing and unpacking they do, and the files they leave are
counted; the last cell's threshold hook saves `x` (the tutorial's saves an undefined
`tensor`), and the `SaveToDisk` module runs a forward and backward pass (the tutorial
only builds it, inside `nn.DataParallel`, which on a CPU runs the module as it is).
Plain PyTorch.
"""
import json
import os
import tempfile
import uuid

import numpy as np
import torch
import torch.nn as nn

rng = np.random.default_rng(0)
result = {}


def randn(*shape, requires_grad=False):
    t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    return t.requires_grad_(requires_grad)


# ----------------------------------------------------------------- saved tensors
a = randn(5, requires_grad=True)
b = torch.ones(5, requires_grad=True)
y = a * b
print(y.grad_fn._saved_self)
print(y.grad_fn._saved_other)


def f(x):
    return x * x


x = randn(5, requires_grad=True)
y = f(f(f(x)))

a = randn(5, requires_grad=True)
b = torch.ones(5, requires_grad=True)
y = a * b
result["saved_is_input"] = [y.grad_fn._saved_self is a, y.grad_fn._saved_other is b]

a = randn(5, requires_grad=True)
y = torch.exp(a)
result["saved_result"] = [y.grad_fn._saved_result.equal(y), y.grad_fn._saved_result is y]

# ----------------------------------------------------------- saved tensors hooks
packed, unpacked = [], []


def pack_hook(x):
    print("Packing", x)
    packed.append(x.tolist())
    return x


def unpack_hook(x):
    print("Unpacking", x)
    unpacked.append(x.tolist())
    return x


a = torch.ones(5, requires_grad=True)
b = torch.ones(5, requires_grad=True) * 2

with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
    y = a * b

y.sum().backward()
# (the unpacking order is left out, sorted: distgrad unpacks a product's operands in the
# opposite order to PyTorch's today)
result["hooks_saw"] = [packed, sorted(unpacked)]

x = randn(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda x: x * 4, lambda x: x / 4):
    y = torch.pow(x, 2)
y.sum().backward()
assert(x.grad.equal(2 * x))

# returning an int
storage = []


def pack(x):
    storage.append(x)
    return len(storage) - 1


def unpack(x):
    return storage[x]


x = randn(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = x * x
y.sum().backward()

assert(x.grad.equal(2 * x))
result["stored_by_index"] = len(storage)


# returning a tuple
def pack(x):
    delta = randn(*x.size())
    return x - delta, lambda x: x + delta


def unpack(packed):
    x, f = packed
    return f(x)


x = randn(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = x * x
y.sum().backward()

assert(torch.allclose(x.grad, 2 * x))

# returning a str
x = randn(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda x: repr(x), lambda x: eval("torch." + x)):
    y = x * x
y.sum().backward()
assert(torch.all(x.grad - 2 * x <= 1e-4))
result["grad_through_repr"] = x.grad.tolist()


# ------------------------------------------------------------ saving tensors to CPU
def pack_hook(x):
    return (x.device, x.cpu())


def unpack_hook(packed):
    device, tensor = packed
    return tensor.to(device)


x = randn(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
    y = x * x
y.sum().backward()

result["cpu_close"] = bool(torch.allclose(x.grad, (2 * x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(randn(5))

    def forward(self, x):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            # some computation
            return self.w * x


x = randn(5)
model = Model()
loss = model(x).sum()
loss.backward()
result["save_on_cpu_grad"] = model.w.grad.tolist()


class SaveToCpu(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return self.module(*args, **kwargs)


torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(10, 100),
    SaveToCpu(nn.Linear(100, 100)),
    nn.Linear(100, 10),
)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(randn(*p.shape) * 0.1)

x = randn(10)
loss = model(x).sum()
loss.backward()
result["save_to_cpu_grad_sums"] = [p.grad.sum().item() for p in model.parameters()]

# ----------------------------------------------------------- saving tensors to disk
tmp_dir_obj = tempfile.TemporaryDirectory()
tmp_dir = tmp_dir_obj.name


def pack_hook(tensor):
    name = os.path.join(tmp_dir, str(uuid.uuid4()))
    torch.save(tensor, name)
    return name


def unpack_hook(name):
    tensor = torch.load(name)
    os.remove(name)
    return tensor


x = torch.ones(5, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
    y = x.pow(2)
print(y.grad_fn._saved_self)
try:
    print(y.grad_fn._saved_self)
    print("Double access succeeded!")
    result["double_access"] = "succeeded"
except:  # noqa: E722 - the tutorial's
    print("Double access failed!")
    result["double_access"] = "failed"


class SelfDeletingTempFile():
    def __init__(self):
        self.name = os.path.join(tmp_dir, str(uuid.uuid4()))

    def __del__(self):
        os.remove(self.name)


# Only save on disk tensors that have size >= 1000
SAVE_ON_DISK_THRESHOLD = 1000
on_disk = []


def pack_hook(x):
    if x.numel() < SAVE_ON_DISK_THRESHOLD:
        return x
    temp_file = SelfDeletingTempFile()
    torch.save(x, temp_file.name)
    on_disk.append(x.numel())
    return temp_file


def unpack_hook(tensor_or_sctf):
    if isinstance(tensor_or_sctf, torch.Tensor):
        return tensor_or_sctf
    return torch.load(tensor_or_sctf.name)


class SaveToDisk(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook):
            return self.module(*args, **kwargs)


net = SaveToDisk(nn.Sequential(nn.Linear(40, 50), nn.Tanh(), nn.Linear(50, 3)))
with torch.no_grad():
    for p in net.parameters():
        p.copy_(randn(*p.shape) * 0.2)
leftover_before = len(os.listdir(tmp_dir))
loss = net(randn(30, 40)).pow(2).sum()
files_during = len(os.listdir(tmp_dir)) - leftover_before
loss.backward()
del loss
# (how many tensors went to disk is left out: distgrad's linear also saves the weight when
# the input needs no gradient, PyTorch's does not)
result["disk"] = {"some_on_disk": files_during > 0 and len(on_disk) == files_during,
                  "files_after": len(os.listdir(tmp_dir)) - leftover_before,
                  "grad_sums": [p.grad.sum().item() for p in net.parameters()]}
print("RESULT " + json.dumps(result))
