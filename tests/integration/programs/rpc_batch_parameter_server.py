"""A batch-updating parameter server: trainers fetch the whole model over RPC, send
gradients back, and get the updated model once enough gradients have arrived.

Port of pytorch/examples `distributed/rpc/batch/parameter_server.py`, shrunk: a
tiny ResNet of BasicBlocks (written here: torchvision is not used) instead of
resnet50, two trainers, an update every two gradients, three batches each. The
model itself travels over RPC (`get_model()` returns it, and so does the future
of `update_and_fetch_model`). The weights and each trainer's batches come from
seeded NumPy generators, so both runs see the same numbers (two gradients are
summed, and IEEE addition of two terms does not depend on their order; they are
added under the server's lock, where the original adds them before taking it
and two trainers' in-place additions can race). As the original, it first starts
a gloo process group (that nothing uses) on the same MASTER_ADDR/MASTER_PORT as
the RPC rendezvous: the two share one store. MASTER_PORT comes from the
environment. Plain PyTorch.
"""
import json
import os
import threading
from datetime import datetime

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
from torch import optim

batch_size = 8
image_w = 16
image_h = 16
num_classes = 6
batch_update_size = 2
num_batches = 3


def timed_log(text):
    print(f"{datetime.now().strftime('%H:%M:%S')} {text}")


# ------------------------------------------------------------- a small ResNet
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None, norm_layer=None):
        super().__init__()
        norm_layer = norm_layer or nn.BatchNorm2d
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=1000, width=8, norm_layer=None):
        super().__init__()
        self._norm_layer = norm_layer or nn.BatchNorm2d
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = self._norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width * block.expansion, num_classes)
        rng = np.random.default_rng(0)  # kaiming normal (fan_out) drawn by NumPy
        for m in self.modules():
            with torch.no_grad():
                if isinstance(m, nn.Conv2d):
                    fan_out = m.weight.shape[0] * m.weight.shape[2] * m.weight.shape[3]
                    m.weight.copy_(torch.from_numpy(rng.normal(
                        0, np.sqrt(2.0 / fan_out), tuple(m.weight.shape)).astype(np.float32)))
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)
                elif isinstance(m, nn.Linear):
                    m.weight.copy_(torch.from_numpy(
                        rng.uniform(-0.3, 0.3, tuple(m.weight.shape)).astype(np.float32)))
                    m.bias.zero_()

    def _make_layer(self, block, planes, blocks, stride=1):
        norm_layer = self._norm_layer
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride=stride, bias=False),
                norm_layer(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, norm_layer)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes, norm_layer=norm_layer))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# -------------------------------------------------------- the parameter server
class BatchUpdateParameterServer(object):

    def __init__(self, batch_update_size=batch_update_size):
        self.model = ResNet(BasicBlock, [1, 1], num_classes=num_classes)
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        timed_log(f"PS got {self.curr_update_size}/{batch_update_size} updates")
        with self.lock:
            # (the original adds the gradients before taking the lock: two trainers'
            # in-place additions can then race, and an update is sometimes lost)
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            self.curr_update_size += 1
            fut = self.future_model

            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                timed_log("PS updated model")
                self.future_model = torch.futures.Future()

        return fut


class Trainer(object):

    def __init__(self, ps_rref):
        self.ps_rref = ps_rref
        self.loss_fn = nn.MSELoss()
        self.rng = np.random.default_rng(rpc.get_worker_info().id)
        self.one_hot_indices = torch.LongTensor(self.rng.integers(0, num_classes, batch_size)) \
            .view(batch_size, 1)

    def get_next_batch(self):
        for _ in range(num_batches):
            inputs = torch.from_numpy(
                self.rng.standard_normal((batch_size, 3, image_w, image_h)).astype(np.float32))
            labels = torch.zeros(batch_size, num_classes).scatter_(1, self.one_hot_indices, 1)
            yield inputs, labels

    def train(self):
        name = rpc.get_worker_info().name
        m = self.ps_rref.rpc_sync().get_model()
        losses = []
        for inputs, labels in self.get_next_batch():
            timed_log(f"{name} processing one batch")
            loss = self.loss_fn(m(inputs), labels)
            loss.backward()
            losses.append(loss.item())
            timed_log(f"{name} reporting grads")
            m = rpc.rpc_sync(
                self.ps_rref.owner(),
                BatchUpdateParameterServer.update_and_fetch_model,
                args=(self.ps_rref, [p.grad for p in m.cpu().parameters()]),
            )
            timed_log(f"{name} got updated model")
        return losses


def run_trainer(ps_rref):
    trainer = Trainer(ps_rref)
    return trainer.train()


def run_ps(trainers):
    timed_log("Start training")
    ps = BatchUpdateParameterServer()
    ps_rref = rpc.RRef(ps)
    futs = []
    for trainer in trainers:
        futs.append(rpc.rpc_async(trainer, run_trainer, args=(ps_rref,)))
    losses = torch.futures.wait_all(futs)
    timed_log("Finish training")
    print("RESULT", json.dumps({
        "losses": losses,
        "weights": [p.detach().sum().item() for p in ps.model.parameters()]}), flush=True)


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")

    # Initialize the process group first
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)

    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60)
    if rank != 0:
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
        # trainer passively waiting for ps to kick off training iterations
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size, rpc_backend_options=options)
        run_ps([f"trainer{r}" for r in range(1, world_size)])
    # block until all rpcs finish
    rpc.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = batch_update_size + 1
    mp.spawn(run, args=(world_size,), nprocs=world_size, join=True)
