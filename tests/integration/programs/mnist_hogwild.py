"""Hogwild training: several processes train one model through shared parameters.

Port of pytorch/examples `mnist_hogwild/main.py` (and its `train.py`, here
`hogwild_train.py`, a module of the program's own directory), shrunk: 16x16 stroke
images (`toy_data.py`) instead of MNIST (the two convolutions then leave a 20-value
feature map instead of 320), 768 training images, two epochs of two processes.
Unchanged otherwise: `model.share_memory()`, then `mp.Process` es (spawned) that each
run their own SGD on it, then the parent tests the model the children trained.
Default initialisation, dropout and shuffling draw from torch's random stream and
the processes race (that is Hogwild), so two libraries agree only in how well the
model learns. Plain PyTorch.
"""
import argparse
import json

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from hogwild_train import test, train
from toy_data import noisy_strokes

# Training settings
parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                    help="input batch size for training (default: 32)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N",
                    help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=2, metavar="N",
                    help="number of epochs to train (default: 2)")
parser.add_argument("--lr", type=float, default=0.05, metavar="LR",
                    help="learning rate (default: 0.05)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M",
                    help="SGD momentum (default: 0.5)")
parser.add_argument("--seed", type=int, default=1, metavar="S",
                    help="random seed (default: 1)")
parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                    help="how many batches to wait before logging training status")
parser.add_argument("--num-processes", type=int, default=2, metavar="N",
                    help="how many training processes to use (default: 2)")
parser.add_argument("--device", type=str, default="cpu",
                    help="backend device")
parser.add_argument("--dry-run", action="store_true", default=False,
                    help="quickly check a single pass")


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(20, 50)
        self.fc2 = nn.Linear(50, 4)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 20)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def strokes_dataset(n, seed):
    images, labels = noisy_strokes(n, seed, size=16)
    return TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))


if __name__ == "__main__":
    args = parser.parse_args()
    device = torch.device(args.device)

    dataset1 = strokes_dataset(768, seed=1)
    dataset2 = strokes_dataset(256, seed=2)
    kwargs = {"batch_size": args.batch_size,
              "shuffle": True}

    torch.manual_seed(args.seed)
    mp.set_start_method("spawn", force=True)

    model = Net().to(device)
    model.share_memory()  # gradients are allocated lazily, so they are not shared here
    initial = [p.detach().clone() for p in model.parameters()]

    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(target=train, args=(rank, args, model, device,
                                           dataset1, kwargs))
        # We first train the model across `num_processes` processes
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    assert all(p.exitcode == 0 for p in processes), [p.exitcode for p in processes]

    # Once training is complete, we can test the model
    test_loss, accuracy = test(args, model, device, dataset2, kwargs)
    moved = [float((p.detach() - q).abs().max()) for p, q in zip(model.parameters(), initial)]
    print("RESULT " + json.dumps({"accuracy": accuracy, "test_loss": test_loss,
                                  "parameters_moved": all(m > 0 for m in moved)}))
