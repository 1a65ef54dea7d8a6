"""Benchmark: distgrad RPC against its floor (raw pyzmq) and torch.distributed.rpc.

Between two processes on this machine, over tcp loopback:
  * round trip of a 16-float tensor (raw pyzmq DEALER/ROUTER echo vs ``rpc_sync``), to a
    user's function (served on a handler thread: one hand-off in each process) and to one
    marked ``rpc.functions.never_blocks`` (served on the callee's I/O thread: one hand-off,
    in the caller);
  * echo throughput of 1, 16 and 64 MB tensors (raw pyzmq zero-copy echo vs ``rpc_sync``);
  * where a round trip's time goes: beside raw pyzmq, the design's skeleton (the same
    threads and hand-offs, nothing else: ``rpc_skeleton.py``), so that what distgrad's
    layers cost and what its threads cost read apart (``rpc_timeline.py`` splits one
    round trip into its stages, in both processes).
Prints a table of medians and ratios and one JSON line. Targets (issue 19): round trip
at most 1.8x raw pyzmq and below PyTorch's; throughput at least 0.8x raw pyzmq for 1 MB and larger and
above PyTorch's at every size; with the same-host shared-memory path, 64 MB at
least 2x PyTorch's figure.

Then the cost of authentication (``RpcBackendOptions.authenticate``, on by default):
worlds with it on and off, alternating, round trip and 64 MB echo over the socket
path; target: within 5% of each other. With ``--encryption-only``: the cost of CURVE
encryption against PLAIN authentication across two simulated hosts (root: network
namespaces), unshaped and at 1 Gbit/s.

    python scripts/bench_rpc.py [--quick] [--auth-only] [--encryption-only]
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distgrad.utils.ports import free_port  # noqa: E402
from rpc_skeleton import SkeletonClient  # noqa: E402 - beside this script

SIZES_MB = (1, 16, 64)


def echo(x):
    return x


def _raw_server(endpoint_q):
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    port = s.bind_to_random_port("tcp://127.0.0.1")
    endpoint_q.put(f"tcp://127.0.0.1:{port}")
    while s.poll(30000):
        frames = s.recv_multipart(copy=False)
        if frames[1].bytes == b"stop":
            s.send_multipart([frames[0], b"stop"])
            break
        s.send_multipart(frames, copy=False)
    s.close()
    ctx.term()


class RawClient:
    """The floor: a DEALER talking to a ROUTER that echoes frames back, zero-copy."""

    def __init__(self):
        import zmq
        q = mp.get_context("spawn").Queue()
        self.proc = mp.get_context("spawn").Process(target=_raw_server, args=(q,), daemon=True)
        self.proc.start()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(q.get(timeout=30))

    def __call__(self, a):
        self.sock.send_multipart([a], copy=False)
        f = self.sock.recv_multipart(copy=False)
        return np.frombuffer(f[0].buffer, dtype=a.dtype)

    def close(self):
        self.sock.send(b"stop")
        self.sock.recv()
        self.sock.close()
        self.ctx.term()
        self.proc.join(10)


def _interleaved(fns, reps, batches):
    """Median seconds per call of each fn, batches alternating so load noise hits all alike."""
    times = {k: [] for k in fns}
    for _ in range(batches):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            times[k].append((time.perf_counter() - t) / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_raw_and_distgrad(small, small_dg, arrays, reps, batches, shm_threshold,
                           skeleton=False):
    """Raw pyzmq and distgrad interleaved, in a fresh world (``shm_threshold`` 0: the
    socket path for every size); ``skeleton``: the design's skeleton (``rpc_skeleton.py``)
    beside them in the round trip."""
    from distgrad.distributed import rpc
    from distgrad.testing.world import World
    raw = RawClient()
    skeletons = {"skeleton": SkeletonClient(), "skeleton_on_arrival": SkeletonClient(True)} \
        if skeleton else {}
    world = World(1, transport="tcp", num_worker_threads=4, allowed_modules=["bench_remote"],
                  shm_threshold=shm_threshold).start()
    f, marked = "bench_remote:echo", "bench_remote:echo_on_arrival"
    try:
        for _ in range(300):
            raw(small)
            rpc.rpc_sync("worker1", f, (small_dg,))
            rpc.rpc_sync("worker1", marked, (small_dg,))
            for client in skeletons.values():
                client(small)
        res = _interleaved({"raw": lambda: raw(small),
                            "dg": lambda: rpc.rpc_sync("worker1", f, (small_dg,)),
                            "marked": lambda: rpc.rpc_sync("worker1", marked, (small_dg,)),
                            **{name: partial(client, small)
                               for name, client in skeletons.items()}},
                           reps, batches)
        out = {"raw": {"rt": res["raw"], **{name: res[name] for name in skeletons}},
               "dg": {"rt": res["dg"], "rt_marked": res["marked"]}}
        for mb, a in arrays.items():
            for _ in range(3):
                raw(a), rpc.rpc_sync("worker1", f, (a,))
            res = _interleaved({"raw": lambda: raw(a),
                                "dg": lambda: rpc.rpc_sync("worker1", f, (a,))},
                               max(2, 32 // mb), batches)
            out["raw"][mb], out["dg"][mb] = res["raw"], res["dg"]
        return out["raw"], out["dg"]
    finally:
        world.close()
        raw.close()
        for client in skeletons.values():
            client.close()


def bench_auth(small_dg, big, reps, batches, rounds):
    """Median seconds per round trip and per 64 MB echo with authentication on and off:
    ``rounds`` worlds of each, alternating (one process has one world at a time), so load
    noise hits both alike."""
    from distgrad.distributed import rpc
    from distgrad.testing.world import World
    f = "bench_remote:echo"
    times = {True: {"rt": [], "big": []}, False: {"rt": [], "big": []}}
    for i in range(rounds):
        # which goes first alternates: a world starting while the last one's processes
        # are still exiting would be slower for it, whichever it is
        for auth in ((True, False) if i % 2 == 0 else (False, True)):
            world = World(1, transport="tcp", num_worker_threads=4, shm_threshold=0,
                          allowed_modules=["bench_remote"], authenticate=auth).start()
            try:
                for _ in range(300):
                    rpc.rpc_sync("worker1", f, (small_dg,))
                for _ in range(2):
                    rpc.rpc_sync("worker1", f, (big,))
                for _ in range(batches):
                    t = time.perf_counter()
                    for _ in range(reps):
                        rpc.rpc_sync("worker1", f, (small_dg,))
                    times[auth]["rt"].append((time.perf_counter() - t) / reps)
                    t = time.perf_counter()
                    for _ in range(2):
                        rpc.rpc_sync("worker1", f, (big,))
                    times[auth]["big"].append((time.perf_counter() - t) / 2)
            finally:
                world.close()
    return {auth: {k: statistics.median(v) for k, v in d.items()} for auth, d in times.items()}


def report_auth(auth, result):
    on, off = auth[True], auth[False]
    mb = big_mb = SIZES_MB[-1]
    print(f"\nauthentication on (PLAIN + ZAP, source bound to the connection) vs off, tcp "
          f"loopback, socket path")
    print(f"{'metric':<27}{'auth on':>10}{'auth off':>10}{'on/off':>8}")
    print(f"{'round trip 16 floats (us)':<27}{on['rt'] * 1e6:10.1f}{off['rt'] * 1e6:10.1f}"
          f"{on['rt'] / off['rt']:8.3f}")
    print(f"{f'echo {mb} MB (MB/s)':<27}{2 * mb / on['big']:10.1f}{2 * mb / off['big']:10.1f}"
          f"{off['big'] / on['big']:8.3f}")
    result["auth"] = {"rt_us": {"on": on["rt"] * 1e6, "off": off["rt"] * 1e6,
                                "ratio": on["rt"] / off["rt"]},
                      f"echo_{big_mb}MB_MBps": {"on": 2 * mb / on["big"],
                                                "off": 2 * mb / off["big"],
                                                "ratio": on["big"] / off["big"]}}
    return on["rt"] / off["rt"] <= 1.05 and on["big"] / off["big"] <= 1.05


def bench_encryption(small_dg, big, reps, batches, rounds, bandwidth=None):
    """Across two simulated hosts (this process and a worker on another network namespace,
    joined by a veth pair through a bridge; ``bandwidth``: tbf on the worker's host):
    median round trip and 64 MB echo of worlds authenticated with PLAIN (the default) and
    encrypted with CURVE, alternating. None where simulated hosts cannot be made."""
    from distgrad.distributed import rpc
    from distgrad.rpc.options import generate_curve_keypair
    from distgrad.testing import hosts as simulated
    from distgrad.testing.world import World
    if simulated.unavailable():
        return None
    f = "bench_remote:echo"
    times = {"plain": {"rt": [], "big": []}, "curve": {"rt": [], "big": []}}
    with simulated.SimulatedHosts(1, attach_caller=True, bandwidth=bandwidth) as hosts:
        for i in range(rounds):
            for kind in (("plain", "curve") if i % 2 == 0 else ("curve", "plain")):
                keys = {}
                if kind == "curve":
                    public, secret = generate_curve_keypair()
                    keys = {"curve_public_key": public, "curve_secret_key": secret}
                world = World(1, hosts=hosts, num_worker_threads=4, shm_threshold=0,
                              allowed_modules=["bench_remote"], worker_env={
                                  "PYTHONPATH": str(Path(__file__).resolve().parent)},
                              **keys).start()
                try:
                    for _ in range(100):
                        rpc.rpc_sync("worker1", f, (small_dg,))
                    rpc.rpc_sync("worker1", f, (big,))
                    for _ in range(batches):
                        t = time.perf_counter()
                        for _ in range(reps):
                            rpc.rpc_sync("worker1", f, (small_dg,))
                        times[kind]["rt"].append((time.perf_counter() - t) / reps)
                        t = time.perf_counter()
                        rpc.rpc_sync("worker1", f, (big,))
                        times[kind]["big"].append(time.perf_counter() - t)
                finally:
                    world.close()
    return {k: {m: statistics.median(v) for m, v in d.items()} for k, d in times.items()}


def report_encryption(enc, result, bandwidth):
    if enc is None:
        print("\nencryption across hosts: skipped (simulated hosts cannot be made here)")
        return
    plain, curve = enc["plain"], enc["curve"]
    mb = SIZES_MB[-1]
    link = f", the worker's host sending at most {bandwidth}" if bandwidth else ""
    print(f"\nacross two simulated hosts (network namespaces, veth through a bridge{link}): "
          f"PLAIN (authenticated, the default) vs CURVE (encrypted)")
    print(f"{'metric':<27}{'plain':>10}{'curve':>10}{'cost':>8}")
    print(f"{'round trip 16 floats (us)':<27}{plain['rt'] * 1e6:10.1f}{curve['rt'] * 1e6:10.1f}"
          f"{curve['rt'] / plain['rt'] - 1:8.1%}")
    print(f"{f'echo {mb} MB (MB/s)':<27}{2 * mb / plain['big']:10.1f}{2 * mb / curve['big']:10.1f}"
          f"{curve['big'] / plain['big'] - 1:8.1%}")
    key = "encryption" + (f"_{bandwidth}" if bandwidth else "")
    result[key] = {"rt_us": {"plain": plain["rt"] * 1e6, "curve": curve["rt"] * 1e6},
                   f"echo_{mb}MB_MBps": {"plain": 2 * mb / plain["big"],
                                         "curve": 2 * mb / curve["big"]},
                   "cost_64MB": curve["big"] / plain["big"] - 1}


def _torch_worker(port):
    import torch.distributed.rpc as trpc
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    trpc.init_rpc("worker1", rank=1, world_size=2)
    trpc.shutdown()


def bench_torch(reps, batches):
    try:
        import torch
        import torch.distributed.rpc as trpc
    except ImportError:
        return None
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    p = mp.get_context("spawn").Process(target=_torch_worker, args=(port,), daemon=True)
    p.start()
    trpc.init_rpc("worker0", rank=0, world_size=2)
    try:
        small = torch.ones(16)
        out = {}
        for _ in range(200):
            trpc.rpc_sync("worker1", echo, (small,))
        out["rt"] = _interleaved({"t": lambda: trpc.rpc_sync("worker1", echo, (small,))},
                                 reps, batches)["t"]
        for mb in SIZES_MB:
            t = torch.ones(mb * (1 << 20) // 4)
            trpc.rpc_sync("worker1", echo, (t,))
            out[mb] = _interleaved({"t": lambda: trpc.rpc_sync("worker1", echo, (t,))},
                                   max(2, 32 // mb), batches)[mb and "t"]
        return out
    finally:
        trpc.shutdown()
        p.join(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--auth-only", action="store_true",
                    help="only the cost of authentication (on vs off)")
    ap.add_argument("--encryption-only", action="store_true",
                    help="only the cost of encryption (CURVE vs PLAIN) across simulated hosts")
    args = ap.parse_args()
    reps, batches = (200, 7) if args.quick else (500, 15)
    small = np.ones(16, dtype=np.float32)
    try:
        from distgrad.autograd.tensor import Tensor
        small_dg = Tensor._wrap(small, requires_grad=False)
    except Exception:
        small_dg = small
    arrays = {mb: np.ones(mb * (1 << 20) // 4, dtype=np.float32) for mb in SIZES_MB}
    if args.encryption_only:
        result = {"bench": "rpc_encryption", "transport": "tcp"}
        for bandwidth in (None, "1Gbit/s"):
            enc = bench_encryption(small_dg, arrays[SIZES_MB[-1]], reps // 5,
                                   max(3, batches // 3), 3 if args.quick else 5, bandwidth)
            report_encryption(enc, result, bandwidth)
        print(json.dumps(result))
        return
    auth = bench_auth(small_dg, arrays[SIZES_MB[-1]], reps, max(3, batches // 3),
                      rounds=3 if args.quick else 5)
    if args.auth_only:
        result = {"bench": "rpc_auth", "transport": "tcp"}
        result["targets_met"] = bool(report_auth(auth, result))
        print(json.dumps(result))
        return
    raw, dg = bench_raw_and_distgrad(small, small_dg, arrays, reps, batches, shm_threshold=0,
                                     skeleton=True)
    raw2, shm = bench_raw_and_distgrad(small, small_dg, arrays, reps, batches, 1 << 20)
    th = None if args.no_torch else bench_torch(reps, batches)

    def mbps(sec, mb):
        return 2 * mb / sec  # bytes cross twice per echo
    rows = [("round trip 16 floats (us)", raw["rt"] * 1e6, dg["rt"] * 1e6, shm["rt"] * 1e6,
             raw2["rt"] * 1e6, th["rt"] * 1e6 if th else None),
            ("  never_blocks fn (us)", raw["rt"] * 1e6, dg["rt_marked"] * 1e6,
             shm["rt_marked"] * 1e6, raw2["rt"] * 1e6, None)]
    for mb in SIZES_MB:
        rows.append((f"echo {mb} MB (MB/s)", mbps(raw[mb], mb), mbps(dg[mb], mb),
                     mbps(shm[mb], mb), mbps(raw2[mb], mb), mbps(th[mb], mb) if th else None))
    print("distgrad RPC vs raw pyzmq (DEALER/ROUTER echo) and torch.distributed.rpc, tcp "
          "loopback,\nmedians of interleaved batches; 'zmq' = socket path for every size, "
          "'shm' = same-host\nshared memory from 1 MB (raw measured again beside it)")
    print(f"{'metric':<27}{'raw pyzmq':>10}{'dg zmq':>9}{'zmq/raw':>8}{'dg shm':>9}"
          f"{'shm/raw':>8}{'torch':>9}{'torch/raw':>10}")
    result = {"bench": "rpc", "transport": "tcp"}
    for name, r, d, m, r2, t in rows:
        ts = f"{t:9.1f}{t / r:10.2f}" if t is not None else f"{'n/a':>9}{'':>10}"
        print(f"{name:<27}{r:10.1f}{d:9.1f}{d / r:8.2f}{m:9.1f}{m / r2:8.2f}{ts}")
    result["rt_us"] = {"raw": raw["rt"] * 1e6, "distgrad": dg["rt"] * 1e6,
                       "distgrad_shm": shm["rt"] * 1e6, "torch": th["rt"] * 1e6 if th else None,
                       "ratio": dg["rt"] / raw["rt"],
                       "distgrad_never_blocks": dg["rt_marked"] * 1e6,
                       "ratio_never_blocks": dg["rt_marked"] / raw["rt"],
                       "skeleton": raw["skeleton"] * 1e6,
                       "skeleton_on_arrival": raw["skeleton_on_arrival"] * 1e6}
    print("\nwhere a 16-float round trip's time goes: the sockets (raw pyzmq), then the design's\n"
          "threads and hand-offs alone (rpc_skeleton.py), then distgrad's layers too")
    for name, sec in (("raw pyzmq", raw["rt"]), ("skeleton, handler thread", raw["skeleton"]),
                      ("distgrad rpc_sync", dg["rt"]),
                      ("skeleton, served on arrival", raw["skeleton_on_arrival"]),
                      ("distgrad never_blocks fn", dg["rt_marked"])):
        print(f"  {name:<29}{sec * 1e6:8.1f} us{sec / raw['rt']:7.2f}x raw")
    for mb in SIZES_MB:
        result[f"echo_{mb}MB_MBps"] = {
            "raw": mbps(raw[mb], mb), "distgrad": mbps(dg[mb], mb),
            "distgrad_shm": mbps(shm[mb], mb), "torch": mbps(th[mb], mb) if th else None,
            "ratio": raw[mb] / dg[mb], "shm_vs_torch": th[mb] / shm[mb] if th else None}
    zmq_ok = result["rt_us"]["ratio"] <= 1.8 and all(
        result[f"echo_{mb}MB_MBps"]["ratio"] >= 0.8 for mb in SIZES_MB)
    torch_ok = th is None or (dg["rt"] < th["rt"] and all(dg[mb] < th[mb] for mb in SIZES_MB)
                              and result["echo_64MB_MBps"]["shm_vs_torch"] >= 2.0)
    auth_ok = report_auth(auth, result)
    result["targets_met"] = bool(zmq_ok and torch_ok and auth_ok)
    print(json.dumps(result))


if __name__ == "__main__":
    import perf_page
    # with --record: its section of docs/performance.md (one per kind of run)
    part = next((f"_{a[2:-5]}" for a in sys.argv if a in ("--auth-only", "--encryption-only")),
                "")
    with perf_page.recorded(f"bench_rpc{part.replace('-', '_')}"):
        main()
