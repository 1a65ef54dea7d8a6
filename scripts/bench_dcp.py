"""Distributed checkpoints: save and load of a 2-rank DDP model and its Adam state, with
distgrad's DCP, PyTorch's DCP (when installed) and the floor: each rank writing its half
of the arrays with NumPy by hand (and reading all of them back), synced as the others.

    python scripts/bench_dcp.py                 # about 64 MB of model + Adam state
    python scripts/bench_dcp.py --mb 8 --reps 3

Two spawned ranks run every candidate in the same run, interleaved, into fresh
directories; a time is rank 0's, from a barrier before the call to a barrier after it.
Prints a table and one JSON line (medians of --reps repetitions)."""
import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

import numpy as np

CANDIDATES = ("distgrad", "torch", "numpy")


def _shapes(mb):
    """Linear layers of width ``w`` whose parameters take about ``mb`` / 3 MB (Adam keeps two
    more copies)."""
    floats = mb * (1 << 20) / 4 / 3
    w = int((floats / 4) ** 0.5)
    return [(w, w), (w,)] * 4


# ---------------------------------------------------------------------- one rank
def _rank(rank, port, torch_port, mb, reps, root, out_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import distgrad
    import distgrad.distributed as dist
    import distgrad.distributed.checkpoint as dcp
    from distgrad.distributed import TCPStore
    from distgrad.distributed.checkpoint.state_dict import get_state_dict
    from distgrad.nn.parallel import DistributedDataParallel as DDP

    store = TCPStore("127.0.0.1", port, timeout=60)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=120)
    shapes = _shapes(mb)
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def mlp(nn):
        layers = [nn.Linear(s[1], s[0]) for s in shapes[::2]]
        return nn.Sequential(*layers)

    ours = mlp(distgrad.nn)
    for p, a in zip(ours.parameters(), init):
        p.data = distgrad.tensor(a)
    ours = DDP(ours)
    opt = distgrad.optim.Adam(ours.parameters())
    ours(distgrad.ones(2, shapes[0][1])).sum().backward()
    opt.step()

    theirs = topt = tdist = None
    try:
        import torch
        import torch.distributed as tdist
        import torch.distributed.checkpoint as tdcp
        from torch.distributed.checkpoint.state_dict import get_state_dict as tget
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(1)
        import datetime
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank,
                                 world_size=2, timeout=datetime.timedelta(seconds=120))
        net = mlp(torch.nn)
        with torch.no_grad():
            for p, a in zip(net.parameters(), init):
                p.copy_(torch.from_numpy(a))
        theirs = torch.nn.parallel.DistributedDataParallel(net)
        topt = torch.optim.Adam(theirs.parameters())
        theirs(torch.ones(2, shapes[0][1])).sum().backward()
        topt.step()

    def state_ours():
        msd, osd = get_state_dict(ours, opt)
        return {"model": msd, "optim": osd}

    def state_theirs():
        msd, osd = tget(theirs, topt)
        return {"model": msd, "optim": osd}

    arrays = [t.numpy() for t in _tensors(state_ours())]

    def floor_save(path):
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, f"rank{rank}.bin"), "wb") as fh:
            for a in arrays[rank::2]:  # each rank its half, as DCP's dedup splits the work
                fh.write(memoryview(np.ascontiguousarray(a)).cast("B"))
            fh.flush()
            os.fsync(fh.fileno())

    def floor_load(path):
        for r in range(2):
            with open(os.path.join(path, f"rank{r}.bin"), "rb") as fh:
                for a in arrays[r::2]:
                    fh.readinto(memoryview(a).cast("B"))

    saves = {"distgrad": lambda p: dcp.save(state_ours(), checkpoint_id=p),
             "numpy": floor_save}
    loads = {"distgrad": lambda p: dcp.load(state_ours(), checkpoint_id=p),
             "numpy": floor_load}
    if torch is not None:
        saves["torch"] = lambda p: tdcp.save(state_theirs(), checkpoint_id=p)
        loads["torch"] = lambda p: tdcp.load(state_theirs(), checkpoint_id=p)

    def timed(fn, path):
        dist.barrier()
        t0 = time.perf_counter()
        fn(path)
        dist.barrier()
        return time.perf_counter() - t0

    times = {op: {c: [] for c in saves} for op in ("save", "load")}
    for rep in range(reps + 1):  # the first repetition warms up, and is not counted
        order = list(saves) if rep % 2 == 0 else list(saves)[::-1]
        for c in order:
            path = os.path.join(root, f"{c}-{rep}")
            s, ld = timed(saves[c], path), timed(loads[c], path)
            if rep:
                times["save"][c].append(s)
                times["load"][c].append(ld)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump({"times": times, "bytes": int(sum(a.nbytes for a in arrays))}, fh)
    dist.barrier()
    if tdist is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()


def _tensors(state):
    out = []

    def walk(v):
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif hasattr(v, "numpy") and getattr(v, "ndim", 0) > 0:
            out.append(v)
    walk(state)
    return out


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64, help="model + Adam state, in MB")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where checkpoints go (default: a temp dir)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from distgrad.distributed import TCPStore
    from distgrad.utils.processes import reap
    from distgrad.rpc.credentials import SECRET_ENV, new_world_secret

    root = tempfile.mkdtemp(prefix="bench-dcp-", dir=args.dir)
    out_path = os.path.join(root, "result.json")
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=60)
    ctx = multiprocessing.get_context("spawn")
    torch_port = _free_port()
    # the ranks' world admits only them (see distgrad.rpc.credentials)
    os.environ.setdefault(SECRET_ENV, new_world_secret())
    procs = [ctx.Process(target=_rank, args=(r, store.port, torch_port, args.mb, args.reps,
                                            root, out_path)) for r in range(2)]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 600
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        codes = [p.exitcode for p in procs]
        if codes != [0, 0]:
            raise SystemExit(f"a rank failed (exit codes {codes})")
        with open(out_path) as fh:
            result = json.load(fh)
    finally:
        reap(procs, grace_period=2.0)
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    report(result, args)


def report(result, args):
    med = {op: {c: statistics.median(v) if v else None for c, v in cols.items()}
           for op, cols in result["times"].items()}
    mb = result["bytes"] / (1 << 20)
    print(f"DCP save/load of a 2-rank DDP model + Adam state: {mb:.1f} MB, medians of "
          f"{args.reps} repetitions (seconds)")
    print(f"{'op':<6}{'distgrad':>10}{'torch':>10}{'numpy floor':>13}{'vs torch':>10}"
          f"{'vs floor':>10}")
    rows = []
    for op in ("save", "load"):
        ours, theirs, floor = (med[op].get(c) for c in CANDIDATES)
        ratio_t = ours / theirs if theirs else None
        ratio_f = ours / floor if floor else None
        cells = [f"{v:.3f}" if v is not None else "n/a" for v in (ours, theirs, floor)]
        print(f"{op:<6}{cells[0]:>10}{cells[1]:>10}{cells[2]:>13}"
              f"{(f'{ratio_t:.2f}x' if ratio_t else 'n/a'):>10}"
              f"{(f'{ratio_f:.2f}x' if ratio_f else 'n/a'):>10}")
        rows.append({"op": op, "distgrad_s": ours, "torch_s": theirs, "numpy_s": floor,
                     "distgrad_over_torch": ratio_t, "distgrad_over_floor": ratio_f})
    print(json.dumps({"bench": "dcp", "mb": round(mb, 2), "reps": args.reps, "rows": rows}))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_dcp"):  # with --record: its section of docs/performance.md
        main()
