"""Parameter-server training: a trainer drives a CNN that lives on a parameter server.

Port of pytorch/examples `distributed/rpc/parameter_server/rpc_parameter_server.py`,
shrunk: one parameter server and one trainer started as `mp.Process` es (the
trainer receives its DataLoaders as process arguments, as in the original),
12x12 stroke images (`toy_data.py`) instead of MNIST, narrow layers, no dropout, no
shuffling, weights from a seeded NumPy generator, so both runs see the same
numbers. MASTER_PORT comes from the environment. Plain PyTorch.
"""
import json
import os
from threading import Lock

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.distributed.optim import DistributedOptimizer
from torch.utils.data import DataLoader, TensorDataset

from toy_data import noisy_strokes


# --------- the network to train
class Net(nn.Module):
    def __init__(self, num_gpus=0):
        super(Net, self).__init__()
        print(f"Using {num_gpus} GPUs to train")
        self.num_gpus = num_gpus
        device = torch.device("cuda:0" if torch.cuda.is_available() and self.num_gpus > 0
                              else "cpu")
        print(f"Putting first 2 convs on {str(device)}")
        self.conv1 = nn.Conv2d(1, 4, 3, 1).to(device)
        self.conv2 = nn.Conv2d(4, 8, 3, 1).to(device)
        print(f"Putting rest of layers on {str(device)}")
        self.dropout1 = nn.Dropout2d(0.0).to(device)
        self.dropout2 = nn.Dropout2d(0.0).to(device)
        self.fc1 = nn.Linear(128, 16).to(device)
        self.fc2 = nn.Linear(16, 4).to(device)
        rng = np.random.default_rng(0)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, tuple(p.shape)).astype(np.float32)))

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        # Move tensor to next device if necessary
        next_device = next(self.fc1.parameters()).device
        x = x.to(next_device)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


# --------- helpers
def call_method(method, rref, *args, **kwargs):
    """Call `method` on the value held by `rref` (runs on the RRef's owner)."""
    return method(rref.local_value(), *args, **kwargs)


def remote_method(method, rref, *args, **kwargs):
    """The result of `method` on the value held by `rref`, computed where it lives."""
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


# --------- parameter server
class ParameterServer(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.model = Net(num_gpus=num_gpus)
        self.input_device = torch.device(
            "cuda:0" if torch.cuda.is_available() and num_gpus > 0 else "cpu")

    def forward(self, inp):
        inp = inp.to(self.input_device)
        out = self.model(inp)
        # RPC sends CPU tensors
        return out.to("cpu")

    # Use dist autograd to retrieve gradients accumulated for this model.
    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        cpu_grads = {}
        for k, v in grads.items():
            k_cpu, v_cpu = k.to("cpu"), v.to("cpu")
            cpu_grads[k_cpu] = v_cpu
        return cpu_grads

    # RRefs of the local parameters, for the DistributedOptimizer.
    def get_param_rrefs(self):
        return [rpc.RRef(param) for param in self.model.parameters()]


param_server = None
global_lock = Lock()


def get_parameter_server(num_gpus=0):
    global param_server
    # Ensure that we get only one handle to the ParameterServer.
    with global_lock:
        if not param_server:
            param_server = ParameterServer(num_gpus=num_gpus)
        return param_server


def run_parameter_server(rank, world_size):
    # The parameter server hosts the model and answers the trainers; rpc.shutdown()
    # waits for every trainer to finish.
    print("PS master initializing RPC")
    rpc.init_rpc(name="parameter_server", rank=rank, world_size=world_size)
    print("RPC initialized! Running parameter server...")
    rpc.shutdown()
    print("RPC shutdown on parameter server.")


# --------- trainers
class TrainerNet(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.num_gpus = num_gpus
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server,
                                            args=(num_gpus,))

    def get_global_param_rrefs(self):
        return remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)

    def forward(self, x):
        return remote_method(ParameterServer.forward, self.param_server_rref, x)


def run_training_loop(rank, num_gpus, train_loader, test_loader):
    net = TrainerNet(num_gpus=num_gpus)
    param_rrefs = net.get_global_param_rrefs()
    opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.05)
    losses = []
    for epoch in range(2):
        for i, (data, target) in enumerate(train_loader):
            with dist_autograd.context() as cid:
                model_output = net(data)
                target = target.to(model_output.device)
                loss = F.nll_loss(model_output, target)
                if i % 5 == 0:
                    print(f"Rank {rank} training batch {i} loss {loss.item()}")
                dist_autograd.backward(cid, [loss])
                # Ensure that dist autograd ran successfully and gradients were returned.
                assert remote_method(ParameterServer.get_dist_gradients,
                                     net.param_server_rref, cid) != {}
                opt.step(cid)
                losses.append(loss.item())
    print("Training complete!")
    print("Getting accuracy....")
    accuracy = get_accuracy(test_loader, net)
    print("RESULT", json.dumps({"losses": losses, "accuracy": accuracy}), flush=True)


def get_accuracy(test_loader, model):
    model.eval()
    correct_sum = 0
    device = torch.device("cuda:0" if model.num_gpus > 0 and torch.cuda.is_available() else "cpu")
    with torch.no_grad():
        for i, (data, target) in enumerate(test_loader):
            out = model(data)
            pred = out.argmax(dim=1, keepdim=True)
            pred, target = pred.to(device), target.to(device)
            correct = pred.eq(target.view_as(pred)).sum().item()
            correct_sum += correct
    accuracy = correct_sum / len(test_loader.dataset)
    print(f"Accuracy {accuracy}")
    return accuracy


def run_worker(rank, world_size, num_gpus, train_loader, test_loader):
    print(f"Worker rank {rank} initializing RPC")
    rpc.init_rpc(name=f"trainer_{rank}", rank=rank, world_size=world_size)
    print(f"Worker {rank} done initializing RPC")
    run_training_loop(rank, num_gpus, train_loader, test_loader)
    rpc.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    world_size = 2
    train_set = TensorDataset(*(torch.from_numpy(a) for a in noisy_strokes(96, seed=0)))
    test_set = TensorDataset(*(torch.from_numpy(a) for a in noisy_strokes(48, seed=1)))
    train_loader = DataLoader(train_set, batch_size=16, shuffle=False)
    test_loader = DataLoader(test_set, batch_size=16, shuffle=False)
    processes = [mp.Process(target=run_parameter_server, args=(0, world_size)),
                 mp.Process(target=run_worker,
                            args=(1, world_size, 0, train_loader, test_loader))]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]
