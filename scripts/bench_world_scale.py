"""How a world's cost grows with its size: N processes spread over simulated hosts form a
world (``init_rpc`` and ``init_process_group`` on one MASTER_ADDR/MASTER_PORT), answer an
all-to-all of RPCs, run a chain of distributed autograd through every rank and an
all_reduce, and shut down. Per size: the time of each part, and per process its file
descriptors, sockets, threads and memory (rank 0, which holds the shutdown barrier and
watches every peer, apart from the others). PyTorch runs the same program beside it for
the sizes given with --torch-sizes (when installed).

    python scripts/bench_world_scale.py                       # 8, 16, 32, 64 on 4 hosts
    python scripts/bench_world_scale.py --sizes 8,16 --hosts 0  # on this host's loopback

Without simulated hosts (not root), ``--hosts 0`` runs every process on loopback. Prints a
table and one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


# ---------------------------------------------------------------------- one member
def _process_stats():
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    with open("/proc/self/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return {"fds": len(fds), "sockets": sockets, "threads": len(os.listdir("/proc/self/task")),
            "rss_mb": rss / 1024}


def echo(x):
    return x


def chain_step(x, k, n, prefix="w"):
    """Pass ``x`` (times 1.5) on to rank ``k + 1`` (named ``prefix`` and its rank); the last
    rank returns it."""
    import distgrad.distributed.rpc as rpc
    y = x * 1.5
    return y if k == n - 1 else rpc.rpc_sync(f"{prefix}{k + 1}", chain_step,
                                             (y, k + 1, n, prefix))


def torch_chain_step(x, k, n):
    import torch.distributed.rpc as rpc
    y = x * 1.5
    return y if k == n - 1 else rpc.rpc_sync(f"w{k + 1}", torch_chain_step, (y, k + 1, n))


_HEARTBEAT_ENV = "BENCH_WORLD_SCALE_HEARTBEAT_TIMEOUT"


def library_modules(library):
    """``(torch, torch.distributed, its autograd, its rpc, the chain step, RPC options)``
    of ``library`` ("torch" or "distgrad", imported as a PyTorch program would)."""
    if library == "torch":
        import torch
        import torch.distributed as dist
        import torch.distributed.autograd as dist_autograd
        import torch.distributed.rpc as rpc
        return (torch, dist, dist_autograd, rpc, torch_chain_step,
                rpc.TensorPipeRpcBackendOptions(rpc_timeout=120, init_method="env://"))
    import distgrad as torch
    import distgrad.distributed as dist
    import distgrad.distributed.autograd as dist_autograd
    import distgrad.distributed.rpc as rpc
    return (torch, dist, dist_autograd, rpc, chain_step,
            rpc.TensorPipeRpcBackendOptions(rpc_timeout=120))


def member(rank, n, master, port, library, started):
    """One process of the world; what it measured (times are wall-clock seconds since
    ``started``, the time the bench began starting processes)."""
    t = {"start": time.time() - started}
    torch, dist, dist_autograd, rpc, step, options = library_modules(library)
    if library == "distgrad" and os.environ.get(_HEARTBEAT_ENV):  # --heartbeat-timeout
        options.heartbeat_timeout = float(os.environ[_HEARTBEAT_ENV])
    t["imported"] = time.time() - started
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR=master,
                      MASTER_PORT=str(port))
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=n, rpc_backend_options=options)
    t["formed"] = time.time() - started
    formed = _process_stats()  # before talking to anyone: what forming the world costs
    futs = [rpc.rpc_async(f"w{p}", echo, (rank,)) for p in range(n) if p != rank]
    assert [f.wait() for f in futs] == [rank] * (n - 1)
    t["all_to_all"] = time.time() - started
    dist.init_process_group("gloo", rank=rank, world_size=n)
    dist.barrier()
    t0 = time.time()
    if rank == 0:
        x = torch.ones(4, requires_grad=True)
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("w1", step, (x, 1, n))
            dist_autograd.backward(cid, [y.sum()])
            grad = dist_autograd.get_gradients(cid)[x]
        assert abs(float(grad[0]) - 1.5 ** (n - 1)) < 1e-3 * 1.5 ** (n - 1)
    dist.barrier()
    t["chain_ms"] = (time.time() - t0) * 1000
    v = torch.ones(1 << 16)
    t0 = time.time()
    dist.all_reduce(v)
    t["all_reduce_ms"] = (time.time() - t0) * 1000
    assert float(v[0]) == n
    stats = _process_stats()
    dist.barrier()
    t0 = time.time()
    rpc.shutdown()
    dist.destroy_process_group()
    t["shutdown"] = time.time() - t0
    return {"times": t, "stats": stats, "formed": formed}


# ---------------------------------------------------------------------- the bench
def run_members(n, hosts, library, port, target="bench_world_scale:member", extra=()):
    """Start ``n`` members, each ``target(rank, n, master, port, library, started,
    *extra)`` (rank r on host r % len(hosts), or locally); their results and errors."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, ROOT]), OMP_NUM_THREADS="1",
               DISTGRAD_WORLD_SECRET="bench-world-scale")
    if hosts:
        master = hosts[0].address
        env.update(TP_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
    else:
        master = "127.0.0.1"
    started = time.time()
    procs = []
    for r in range(n):
        args = [target, None, json.dumps([r, n, master, port, library, started, *extra])]
        if hosts:
            procs.append(hosts[r % len(hosts)].spawn(target, r, n, master, port, library,
                                                     started, *extra, env=env))
        else:
            fd, path = tempfile.mkstemp(suffix=".json")
            os.close(fd)
            os.unlink(path)
            args[1] = path
            procs.append(_LocalCall(subprocess.Popen(
                [sys.executable, "-m", "distgrad.testing.host_call", *args], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), path))
    results, errors = [], []
    for r, p in enumerate(procs):
        try:
            results.append(p.result(600))
        except Exception as e:  # noqa: BLE001 - reported in the table
            errors.append(f"rank {r}: {str(e)[-3000:]}")
    for e in errors:
        print(f"  {e.splitlines()[0][:300]}", file=sys.stderr)
        tail = [line for line in e.splitlines() if "Error" in line or "Assert" in line]
        for line in tail[-3:]:
            print(f"      {line[:300]}", file=sys.stderr)
    return results, errors


class _LocalCall:
    def __init__(self, popen, path):
        self.popen, self.path = popen, path

    def result(self, timeout):
        try:
            _, err = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            _, err = self.popen.communicate()
        try:
            with open(self.path) as fh:
                outcome = json.load(fh)
            os.unlink(self.path)
        except (OSError, ValueError):
            raise RuntimeError(f"a member ended ({self.popen.returncode}) without a result: "
                               f"{err[-1500:]}") from None
        if "error" in outcome:
            raise RuntimeError(outcome["error"] + "\n" + outcome["traceback"][-1500:])
        return outcome["value"]


def _summary(n, nhosts, library, results, errors):
    row = {"library": library, "n": n, "hosts": nhosts, "errors": len(errors)}
    if errors or len(results) != n:
        row["error"] = errors[0] if errors else "missing results"
        return row
    times = [r["times"] for r in results]
    others = [r["stats"] for r in results[1:]]
    row.update(
        formed_s=max(t["formed"] for t in times),
        formed_after_import_s=max(t["formed"] for t in times) - max(t["imported"] for t in times),
        all_to_all_s=max(t["all_to_all"] for t in times) - max(t["formed"] for t in times),
        chain_ms=times[0]["chain_ms"], all_reduce_ms=max(t["all_reduce_ms"] for t in times),
        shutdown_s=max(t["shutdown"] for t in times),
        rank0=results[0]["stats"],
        others={k: statistics.median(s[k] for s in others) for k in others[0]},
        others_max={k: max(s[k] for s in others) for k in others[0]},
        others_formed={k: statistics.median(r["formed"][k] for r in results[1:])
                       for k in others[0]})
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="8,16,32,64")
    p.add_argument("--torch-sizes", default="8,16")
    p.add_argument("--hosts", type=int, default=4, help="simulated hosts (0: this host only)")
    p.add_argument("--heartbeat-timeout", type=float, default=None,
                   help="distgrad's heartbeat bound (default: RpcBackendOptions')")
    args = p.parse_args()
    if args.heartbeat_timeout is not None:
        os.environ[_HEARTBEAT_ENV] = str(args.heartbeat_timeout)  # the members inherit it
    sizes = [int(s) for s in args.sizes.split(",") if s]
    torch_sizes = [int(s) for s in args.torch_sizes.split(",") if s]
    try:
        import torch  # noqa: F401
    except ImportError:
        torch_sizes = []
    from distgrad.testing import hosts as simulated
    made = None
    if args.hosts:
        why = simulated.unavailable()
        if why:
            print(f"no simulated hosts ({why}): running on this host's loopback")
        else:
            made = simulated.SimulatedHosts(args.hosts)
    rows = []
    try:
        port = 29600
        for n in sizes:
            for library in ["distgrad"] + (["torch"] if n in torch_sizes else []):
                port += 1
                results, errors = run_members(n, list(made) if made else None, library, port)
                rows.append(_summary(n, len(made) if made else 1, library, results, errors))
                _print_row(rows[-1])
    finally:
        if made is not None:
            made.close()
    print(json.dumps({"bench": "world_scale", "rows": rows}))


_HEADER = (f"{'library':9} {'N':>4} {'hosts':>5} {'formed s':>9} {'a2a s':>7} {'chain ms':>9} "
           f"{'ar ms':>7} {'down s':>7} | {'fds 0':>6} {'socks 0':>7} {'thr 0':>5} {'MB 0':>6} | "
           f"{'fds@form':>8} {'socks@form':>10} | {'fds':>5} {'socks':>5} {'thr':>4} {'MB':>6}\n"
           "(rank 0 and the median other process; @form: after init_rpc, before talking to "
           "anyone; the rest after the all-to-all, which talks to everyone)")
_printed = False


def _print_row(row):
    global _printed
    if not _printed:
        print(_HEADER)
        _printed = True
    if "error" in row:
        print(f"{row['library']:9} {row['n']:>4} {row['hosts']:>5}  FAILED: "
              f"{row['error'].splitlines()[-1][:150]}")
        return
    z, o = row["rank0"], row["others"]
    print(f"{row['library']:9} {row['n']:>4} {row['hosts']:>5} {row['formed_s']:9.2f} "
          f"{row['all_to_all_s']:7.2f} {row['chain_ms']:9.1f} {row['all_reduce_ms']:7.1f} "
          f"{row['shutdown_s']:7.2f} | {z['fds']:>6} {z['sockets']:>7} {z['threads']:>5} "
          f"{z['rss_mb']:6.0f} | {row['others_formed']['fds']:>8.0f} "
          f"{row['others_formed']['sockets']:>10.0f} | {o['fds']:>5.0f} {o['sockets']:>5.0f} "
          f"{o['threads']:>4.0f} {o['rss_mb']:6.0f}", flush=True)


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_world_scale"):  # with --record: docs/performance.md
        main()
