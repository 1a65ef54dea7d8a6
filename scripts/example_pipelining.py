"""Train a 4-stage model on 2 ranks with a zero-bubble schedule (ZB-V), as a
``torch.distributed.pipelining`` program does.

Each rank holds two stages of the model (a V: rank 0 the first and the last, rank 1 the
two in the middle), ``ScheduleZBVZeroBubble`` runs 8 micro-batches per step, splitting
each backward into the gradients the stage before waits for (I) and the weights' ones
(W), which fill what would be idle time. Rank 0 prints the loss.

    python scripts/example_pipelining.py                     # spawns its 2 ranks
    python -m distgrad.distributed.run --nproc-per-node 2 scripts/example_pipelining.py
"""
import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import distgrad  # noqa: E402
import distgrad.distributed as dist  # noqa: E402
import distgrad.multiprocessing as mp  # noqa: E402
from distgrad import nn  # noqa: E402
from distgrad.distributed.pipelining import PipelineStage, ScheduleZBVZeroBubble  # noqa: E402


def model():
    distgrad.manual_seed(0)  # every rank builds the same model and keeps its stages
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(3)],
                         nn.Linear(16, 1))


def train(rank, world_size, steps):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    full = model()
    mine = [rank, 2 * world_size - 1 - rank]  # the V: stage r and its mirror
    stages = [PipelineStage(full[i], i, 2 * world_size) for i in mine]
    schedule = ScheduleZBVZeroBubble(stages, n_microbatches=8, loss_fn=nn.MSELoss())
    opt = distgrad.optim.Adam([p for s in stages for p in s.submod.parameters()], lr=1e-2)
    g = np.random.default_rng(0)
    x = distgrad.tensor(g.standard_normal((64, 16)).astype(np.float32))
    y = x.sum(1, keepdim=True).tanh()
    for step in range(steps):
        losses = []
        if rank == 0:  # the first stage takes the input, the last (here too) the target
            schedule.step(x, target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
        if rank == 0 and (step + 1) % 10 == 0:
            print(f"step {step + 1}: loss {sum(l.item() for l in losses) / len(losses):.4f}",
                  flush=True)
    dist.destroy_process_group()


def _spawned(rank, world_size, port, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    train(rank, world_size, steps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if "RANK" in os.environ:  # started by a launcher (torchrun)
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(2, port, args.steps), nprocs=2)


if __name__ == "__main__":
    main()
