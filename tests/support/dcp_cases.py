"""What the ranks of a ``pg_world.World`` run for the distributed checkpoint tests: a DDP
model and its Adam state saved by the first ``n`` ranks (in their group) and loaded by
another number of ranks; a failure on one rank; a rank killed in the middle of a save;
the same training saved by distgrad's DCP and by PyTorch's.

Cases return digests (name -> sha1 of the bytes), so the test can compare what was
saved with what was loaded, on every rank and in the test process itself."""
import hashlib
import os
import time

import numpy as np

import distgrad
import distgrad.distributed.checkpoint as dcp
from distgrad import nn
from distgrad.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from distgrad.nn.parallel import DistributedDataParallel as DDP
from support import pg_world

CASES, case = pg_world.registry()


def mlp(seed):
    g = np.random.default_rng(seed)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    for p in net.parameters():
        p.data = distgrad.tensor(g.standard_normal(tuple(p.shape)).astype(np.float32) * 0.3)
    return net


def data(rank):
    g = np.random.default_rng(100 + rank)
    return (g.standard_normal((4, 6)).astype(np.float32),
            g.standard_normal((4, 3)).astype(np.float32))


def train(model, optim, rank, steps=2):
    x, y = data(rank)
    for _ in range(steps):
        optim.zero_grad()
        ((model(distgrad.tensor(x)) - distgrad.tensor(y)) ** 2).mean().backward()
        optim.step()


def digests(model_sd, optim_sd):
    """{key: sha1} of every tensor and value of the two state dicts (canonical keys)."""
    out = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, distgrad.Tensor):
            out[prefix] = hashlib.sha1(np.ascontiguousarray(value.detach().numpy())
                                       .tobytes()).hexdigest()
        else:
            out[prefix] = repr(value)
    walk("model", model_sd)
    walk("optim", optim_sd)
    return out


def fresh(ctx, n, seed):
    model = DDP(mlp(seed), process_group=ctx.groups[n])
    return model, distgrad.optim.Adam(model.parameters(), lr=0.01)


@case
def save_trained(ctx, path, n, extra=None):
    """Ranks 0..n-1 train a DDP model for two steps and save it with its Adam state."""
    model, optim = fresh(ctx, n, 0)
    train(model, optim, ctx.rank)
    msd, osd = get_state_dict(model, optim)
    md = dcp.save({"model": msd, "optim": osd, "extra": {"step": 2} if extra is None else extra},
                  checkpoint_id=path, process_group=ctx.groups[n])
    return {"digests": digests(msd, osd), "keys": sorted(md.state_dict_metadata),
            "files": sorted(os.listdir(path))}


@case
def load_into_fresh(ctx, path, n, extra=True):
    """Ranks 0..n-1 load the checkpoint into a DDP model built from another seed."""
    model, optim = fresh(ctx, n, 7)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, **({"extra": {"step": -1}} if extra else {})}
    dcp.load(state, checkpoint_id=path, process_group=ctx.groups[n])
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    msd, osd = get_state_dict(model, optim)
    return {"digests": digests(msd, osd), "extra": state.get("extra")}


class FailOnRank1(dcp.DefaultSavePlanner):
    def create_local_plan(self):
        if self.rank == 1:
            raise ValueError("no plan on rank 1")
        return super().create_local_plan()


@case
def fail_on_one_rank(ctx, path):
    """A planner that raises on rank 1: both ranks raise CheckpointException naming it."""
    planner = FailOnRank1()
    planner.rank = ctx.rank
    try:
        dcp.save({"x": distgrad.ones(3)}, checkpoint_id=path, planner=planner,
                 process_group=ctx.groups[2])
    except dcp.CheckpointException as e:
        return {"ranks": sorted(e.failures), "kinds": [type(v).__name__ for v in
                                                       e.failures.values()], "text": str(e)}
    raise AssertionError("save did not raise")


@case
def save_rank_local(ctx, path, n):
    """``use_collectives=False``: each rank alone, with metadata of its own."""
    dcp.save({"x": distgrad.full((3,), float(ctx.rank))}, checkpoint_id=path,
             process_group=ctx.groups[n], use_collectives=False)
    return sorted(os.listdir(path))


@case
def load_rank_local(ctx, path, n):
    state = {"x": distgrad.zeros(3)}
    try:
        dcp.load(state, checkpoint_id=path, process_group=ctx.groups[n])
    except dcp.CheckpointException as e:
        return ["error", str(e)]
    return ["ok", state["x"].tolist()]


@case
def async_save_and_mutate(ctx, path):
    """async_save copies the tensors first: changing them afterwards changes nothing saved."""
    model, optim = fresh(ctx, 2, 0)
    train(model, optim, ctx.rank)
    msd, osd = get_state_dict(model, optim)
    before = digests(msd, osd)
    future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path,
                            process_group=ctx.groups[2])
    with distgrad.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    md = future.result(timeout=60)
    return {"digests": before, "keys": len(md.state_dict_metadata)}


class _HangingWriter(dcp.FileSystemWriter):
    """Writes its first file, says so in the store, then waits (a bounded wait) to be
    killed: a rank that dies in the middle of a save."""

    def __init__(self, path, ctx):
        super().__init__(path)
        self.ctx = ctx

    def _write_file(self, name, items, planner):
        out = super()._write_file(name, items, planner)
        self.ctx.store.set(f"dcp-writing/{self.path}", str(os.getpid()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # killed long before; never returns normally
            time.sleep(0.05)
        raise AssertionError("the test did not kill this rank")


@case
def save_then_die(ctx, path, value):
    """Rank 1 hangs (and is killed by the test) in the middle of a save of ``value``."""
    sd = {"w": distgrad.full((64,), float(value)), "v": distgrad.full((8,), float(value))}
    writer = _HangingWriter(path, ctx) if ctx.rank == 1 else dcp.FileSystemWriter(path)
    try:
        dcp.save(sd, storage_writer=writer, process_group=ctx.groups[2])
    except Exception as e:  # noqa: BLE001 - the test wants to know what rank 0 saw
        return ["raised", type(e).__name__, str(e)[:2000]]
    return ["saved"]


@case
def save_values(ctx, path, value):
    sd = {"w": distgrad.full((64,), float(value)), "v": distgrad.full((8,), float(value))}
    dcp.save(sd, checkpoint_id=path, process_group=ctx.groups[2])
    return sorted(os.listdir(path))


@case
def dcp_against_torch(ctx, ours_path, theirs_path, port_key):
    """The same DDP training in distgrad and in torch (gloo), each saved with its own DCP
    and loaded back into a fresh model of its own library: same keys, same per-rank file
    layout, and the values each library loads equal what the other trained."""
    import torch
    import torch.distributed as tdist
    import torch.distributed.checkpoint as tdcp
    from torch.distributed.checkpoint.state_dict import (get_state_dict as tget,
                                                         set_state_dict as tset)
    if ctx.rank == 0:
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ctx.store.set(port_key, str(s.getsockname()[1]))
        s.close()
    port = int(ctx.store.get(port_key))
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctx.rank,
                             world_size=2)
    try:
        torch.set_num_threads(1)

        def torch_model(seed):
            net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                      torch.nn.Linear(16, 3))
            with torch.no_grad():
                for p, q in zip(net.parameters(), mlp(seed).parameters()):
                    p.copy_(torch.from_numpy(q.detach().numpy()))
            model = torch.nn.parallel.DistributedDataParallel(net)
            return model, torch.optim.Adam(model.parameters(), lr=0.01)

        theirs, topt = torch_model(0)
        x, y = data(ctx.rank)
        for _ in range(2):
            topt.zero_grad()
            ((theirs(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean().backward()
            topt.step()
        tmsd, tosd = tget(theirs, topt)
        tmd = tdcp.save({"model": tmsd, "optim": tosd}, checkpoint_id=theirs_path)
        ours = save_trained(ctx, ours_path, 2, extra={})
        loaded = load_into_fresh(ctx, ours_path, 2, extra=False)

        theirs2, topt2 = torch_model(7)
        tmsd2, tosd2 = tget(theirs2, topt2)
        state = {"model": tmsd2, "optim": tosd2}
        tdcp.load(state, checkpoint_id=theirs_path)
        tset(theirs2, topt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
        tmsd2, tosd2 = tget(theirs2, topt2)
        flat_theirs = {}
        for k, v in {**{f"model.{k}": v for k, v in tmsd2.items()},
                     **{f"optim.{fqn}.{n}": t for fqn, st in tosd2["state"].items()
                        for n, t in st.items()}}.items():
            flat_theirs[k] = v.detach().numpy().copy()
        model, optim = fresh(ctx, 2, 7)
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ours_path, process_group=ctx.groups[2])
        flat_ours = {**{f"model.{k}": v.numpy() for k, v in state["model"].items()},
                     **{f"optim.{fqn}.{n}": t.numpy() for fqn, st in state["optim"]["state"].items()
                        for n, t in st.items()}}
        err = max(float(np.abs(flat_ours[k].astype(np.float64) - flat_theirs[k]).max())
                  for k in flat_theirs)
        return {"our_keys": ours["keys"], "their_keys": sorted(tmd.state_dict_metadata),
                "our_files": ours["files"], "their_files": sorted(os.listdir(theirs_path)),
                "same_after_load": ours["digests"] == loaded["digests"], "err": err}
    finally:
        tdist.destroy_process_group()
