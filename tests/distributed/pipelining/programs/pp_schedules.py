"""A torch.distributed.pipelining program: every schedule trains the same model for two
steps on 2 ranks (gloo), then evaluates; each rank prints ``RESULT {json}`` with its
gradients' sums and norms, the last stage's losses and outputs.

    torchrun --nproc-per-node 2 pp_schedules.py             # on PyTorch
    python -m distgrad.compat.as_torch -m torch.distributed.run --nproc-per-node 2 \
        pp_schedules.py                                      # on distgrad

Weights and data come from a seeded NumPy generator, so both frameworks start equal.
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime, get_schedule_class

D, ROWS, CHUNKS = 16, 24, 4
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]
V_SHAPED = ("ZBVZeroBubble", "DualPipeV", "csv")
CSV = "0F0,0F1,0F2,0F3,3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3,0B0,0B1,0B2,0B3\n" \
      "1F0,2F0,1F1,2F1,1F2,2F2,1F3,2F3,2B0,1B0,2B1,1B1,2B2,1B2,2B3,1B3"


def layer(rng):
    m = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.Tanh())
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype("float32") * 0.3))
    return m


def stages_of(name, rank, world):
    if name in ("GPipe", "1F1B"):
        return [rank], world
    if name in V_SHAPED:
        return [rank, 2 * world - 1 - rank], 2 * world
    return [rank, rank + world], 2 * world


def run(name, rank, world):
    rng = np.random.default_rng(0)
    indices, n_stages = stages_of(name, rank, world)
    layers = [layer(rng) for _ in range(n_stages)]
    data = np.random.default_rng(1)
    x = torch.from_numpy(data.standard_normal((ROWS, D)).astype("float32"))
    y = torch.from_numpy(data.standard_normal((ROWS, D)).astype("float32"))
    stages = [PipelineStage(layers[i], i, n_stages, torch.device("cpu")) for i in indices]
    loss_fn = torch.nn.MSELoss()
    if name == "csv":
        schedule = _PipelineScheduleRuntime(stages, CHUNKS, loss_fn=loss_fn)
        path = os.path.join(tempfile.mkdtemp(), "order.csv")
        with open(path, "w") as fh:
            fh.write(CSV + "\n")
        schedule._load_csv(path)
    else:
        cls = get_schedule_class(name)
        schedule = cls(stages[0] if len(stages) == 1 else stages, CHUNKS, loss_fn=loss_fn)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    out, losses = None, []
    for _ in range(2):
        for m in layers:
            m.zero_grad()
        out = schedule.step(*((x,) if first else ()),
                            **({"target": y, "losses": losses} if last else {}))
    result = {"grads": {str(i): [float(p.grad.sum()), float(p.grad.norm())]
                        for i in indices for p in layers[i].parameters()}}
    if last:
        result["losses"] = [float(v) for v in losses]
        result["out"] = float(out.sum())
    if name in V_SHAPED:  # PyTorch 2.13's eval() of these fails ("can't steal_bwd_input")
        return result
    if last:
        evaluated = schedule.eval(*((x,) if first else ()), target=y, losses=(ev := []))
        result["eval"] = [float(evaluated.sum()), [float(v) for v in ev]]
    else:
        schedule.eval(*((x,) if first else ()))
    return result


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {name: run(name, rank, world) for name in SCHEDULES + ["csv"]}
    for turn in range(world):  # one rank at a time: the ranks share one pipe, and a line
        if turn == rank:       # longer than the pipe's atomic write would interleave
            sys.stdout.write("RESULT " + json.dumps({"rank": rank, "results": results}) + "\n")
            sys.stdout.flush()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
