"""Pipeline parallelism over RPC: a ResNet-like model split in two shards on two workers.

Port of pytorch/examples `distributed/rpc/pipeline/main.py`, shrunk: the model
is a tiny ResNet of Bottleneck blocks (written here: torchvision is not used),
16x16 inputs, two batches of two micro-batches, three processes (master,
worker1, worker2). Each shard's convolution weights come from a seeded NumPy
generator (in place of `kaiming_normal_`), inputs and labels too, so both runs
see the same numbers. MASTER_PORT comes from the environment. Plain PyTorch.
"""
import json
import os
import threading

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef


# ---------------------------------------------------------------- helper functions
def _call_method(method, rref, *args, **kwargs):
    """Call a method on the value held by `rref` (runs on the RRef's owner)."""
    return method(rref.local_value(), *args, **kwargs)


def _remote_on_rref(method, rref, *args, **kwargs):
    """Run `method` on the owner of `rref`; return an RRef of the result."""
    return rpc.remote(rref.owner(), _call_method, args=[method, rref] + list(args),
                      kwargs=kwargs)


def _async_on_rref(method, rref, *args, **kwargs):
    """Run `method` on the owner of `rref`; return a future of the result."""
    return rpc.rpc_async(rref.owner(), _call_method, args=[method, rref] + list(args),
                         kwargs=kwargs)


def _parameter_rrefs(module):
    """One RRef for each parameter of a local module."""
    return [RRef(param) for param in module.parameters()]


# ------------------------------------------------------------ a model-parallel ResNet
num_classes = 10


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None, norm_layer=None):
        super(Bottleneck, self).__init__()
        norm_layer = norm_layer or nn.BatchNorm2d
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = norm_layer(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = norm_layer(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNetBase(nn.Module):
    def __init__(self, block, inplanes, num_classes=1000, norm_layer=None):
        super(ResNetBase, self).__init__()
        self._lock = threading.Lock()
        self._block = block
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = inplanes

    def _make_layer(self, planes, blocks, stride=1):
        norm_layer = self._norm_layer
        downsample = None
        if stride != 1 or self.inplanes != planes * self._block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * self._block.expansion, stride),
                norm_layer(planes * self._block.expansion),
            )
        layers = [self._block(self.inplanes, planes, stride, downsample, norm_layer)]
        self.inplanes = planes * self._block.expansion
        for _ in range(1, blocks):
            layers.append(self._block(self.inplanes, planes, norm_layer=norm_layer))
        return nn.Sequential(*layers)

    def _init_weights(self, seed):
        rng = np.random.default_rng(seed)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # kaiming normal, fan_out, for relu
                fan_out = m.weight.shape[0] * m.weight.shape[2] * m.weight.shape[3]
                w = rng.normal(0, np.sqrt(2.0 / fan_out), tuple(m.weight.shape))
                with torch.no_grad():
                    m.weight.copy_(torch.from_numpy(w.astype(np.float32)))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                with torch.no_grad():
                    m.weight.copy_(torch.from_numpy(
                        rng.uniform(-0.2, 0.2, tuple(m.weight.shape)).astype(np.float32)))
                    m.bias.zero_()


class ResNetShard1(ResNetBase):
    """The first part of the ResNet."""

    def __init__(self, device, *args, **kwargs):
        super(ResNetShard1, self).__init__(Bottleneck, 8, num_classes=num_classes, *args, **kwargs)
        self.device = device
        self.seq = nn.Sequential(
            nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False),
            self._norm_layer(self.inplanes),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            self._make_layer(4, 2),
        ).to(self.device)
        self._init_weights(1)

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.seq(x)
        return out.cpu()


class ResNetShard2(ResNetBase):
    """The second part of the ResNet."""

    def __init__(self, device, *args, **kwargs):
        super(ResNetShard2, self).__init__(Bottleneck, 16, num_classes=num_classes, *args, **kwargs)
        self.device = device
        self.seq = nn.Sequential(
            self._make_layer(8, 2, stride=2),
            nn.AdaptiveAvgPool2d((1, 1)),
        ).to(self.device)
        self.fc = nn.Linear(8 * self._block.expansion, num_classes).to(self.device)
        self._init_weights(2)

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.fc(torch.flatten(self.seq(x), 1))
        return out.cpu()


class DistResNet(nn.Module):
    """Assemble two parts as an nn.Module and define pipelining logic."""

    def __init__(self, split_size, workers, *args, **kwargs):
        super(DistResNet, self).__init__()
        self.split_size = split_size
        # Put the first part of the ResNet on workers[0]
        self.p1_rref = rpc.remote(workers[0], ResNetShard1, args=("cpu",) + args, kwargs=kwargs)
        # Put the second part of the ResNet on workers[1]
        self.p2_rref = rpc.remote(workers[1], ResNetShard2, args=("cpu",) + args, kwargs=kwargs)

    def forward(self, xs):
        # Split the input batch xs into micro-batches, and collect async RPC futures
        out_futures = []
        for x in iter(xs.split(self.split_size, dim=0)):
            x_rref = RRef(x)
            y_rref = _remote_on_rref(ResNetShard1.forward, self.p1_rref, x_rref)
            z_fut = _async_on_rref(ResNetShard2.forward, self.p2_rref, y_rref)
            out_futures.append(z_fut)
        # collect and cat all output tensors into one tensor.
        return torch.cat(torch.futures.wait_all(out_futures))

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(_remote_on_rref(_parameter_rrefs, self.p1_rref).to_here())
        remote_params.extend(_remote_on_rref(_parameter_rrefs, self.p2_rref).to_here())
        return remote_params


# ------------------------------------------------------------------- run processes
num_batches = 2
batch_size = 8
image_w = 16
image_h = 16


def run_master(split_size):
    # put the two model parts on worker1 and worker2 respectively
    model = DistResNet(split_size, ["worker1", "worker2"])
    loss_fn = nn.MSELoss()
    opt = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.05)
    rng = np.random.default_rng(0)
    one_hot_indices = torch.LongTensor(rng.integers(0, num_classes, batch_size)) \
        .view(batch_size, 1)
    losses = []
    for i in range(num_batches):
        print(f"Processing batch {i}")
        # generate random inputs and labels
        inputs = torch.from_numpy(
            rng.standard_normal((batch_size, 3, image_w, image_h)).astype(np.float32))
        labels = torch.zeros(batch_size, num_classes).scatter_(1, one_hot_indices, 1)
        with dist_autograd.context() as context_id:
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
            losses.append(loss.item())
    with torch.no_grad():
        final = loss_fn(model(inputs), labels).item()
    print("RESULT", json.dumps({"losses": losses, "final": final}), flush=True)


def run_worker(rank, world_size, num_split):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60)
    if rank == 0:
        rpc.init_rpc("master", rank=rank, world_size=world_size, rpc_backend_options=options)
        run_master(num_split)
    else:
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    # block until all rpcs finish
    rpc.shutdown()


if __name__ == "__main__":
    world_size = 3
    split_size = 4
    mp.spawn(run_worker, args=(world_size, split_size), nprocs=world_size, join=True)
