"""Across two hosts: all_reduce against the link, and ``wide`` trained by DDP, a pipeline
and the autograd strategy, beside PyTorch's DDP and GPipe on the same hosts.

    python scripts/bench_hosts.py                 # the full table (about 20 min on 2 cores)
    python scripts/bench_hosts.py --quick         # a smoke test: 1 Gbit/s, tiny sizes
    python scripts/bench_hosts.py --record        # also its section of docs/performance.md
    python scripts/bench_hosts.py --only ddp --bandwidth 10Gbit/s   # some rows (see --only)

Two simulated hosts (``distgrad.testing.hosts``: network namespaces on a switch, each
with its own ``/dev/shm``, so no same-host shortcut is taken between them), each
sending at most ``--bandwidth`` (``tc tbf``; 10 Gbit/s and 1 Gbit/s by default, one
pair of hosts per bandwidth). Delay cannot be made by the kernel here (no ``netem``),
so distgrad's transports add it: ``200us`` per message (``world.simulated_link`` for
the RPC world of a launch, ``pg_options.simulated_link`` for the process group), with
a link rate far above the real one, so the bandwidth is tbf's alone. PyTorch's gloo
gets no delay: its rows are the easier case.

(a) all_reduce of 64 MB, one rank per host: distgrad's process group, PyTorch's gloo,
    and the floor, two pyzmq sockets that swap 64 MB (what a 2-rank ring sends each
    way). Bus bandwidth (for 2 ranks, bytes / time) against the link rate.
(b) ``wide`` (configs/wide.toml: eight 1024x1024 layers, batch 256, Adam) under
    ``distgrad launch``, the coordinator and one worker on host0, the other worker on
    host1: DDP (2 replicas, 128 samples each), one replica alone with 128 samples
    (the step without communication), the pipeline (2 stages, GPipe, micro-batches)
    and the autograd strategy; PyTorch's GPipe over gloo (torch.distributed.pipelining,
    ``scripts/bench_launch.py``'s program), one stage per host. And DDP as a plain
    program, one rank per host, each step timed beside a ``no_sync()`` step of the
    same processes (the ratio says whether the all-reduce hides behind backward),
    distgrad's and PyTorch's, with the CPU time of each step (all the process's
    threads): the two ranks share this machine's cores, so communication hides only
    in cores that others leave idle, and the CPU ratio is what the step ratio becomes
    where none are.

Every configuration runs once per round, rounds one after the other, so load from
elsewhere hits one repetition of each; the table shows medians over rounds. Prints a
table and one JSON line. Needs root (network namespaces): says why not and exits 0
where they cannot be made.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial

import bench_launch
from bench_launch import CONFIGS, ROOT, window_rate

DELAY = "200us"
LINK_RATE = "100Tbit/s"   # the simulated link's own rate: far above tbf's, so tbf limits
BANDWIDTHS = ("10Gbit/s", "1Gbit/s")
TARGETS = {"all_reduce_link_min_1g": 0.90, "all_reduce_vs_gloo_min_10g": 2.0,
           "ddp_vs_no_comm_max_10g": 1.15}
PORTS = iter(range(29600, 65000))  # in the hosts' own namespaces: nothing else is there


# -- children: one process on one host ------------------------------------------------

def _join(which, rank, addr, port, link):
    if which == "torch":
        import torch as lib
        import torch.distributed as dist
        lib.set_num_threads(1)
        options = None
    else:
        import distgrad as lib
        import distgrad.distributed as dist
        from distgrad.distributed.rpc import RpcBackendOptions
        options = RpcBackendOptions(simulated_link=link) if link else None
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank,
                            world_size=2, pg_options=options)
    return lib, dist


def _all_reduce_child(which, rank, addr, port, nbytes, reps, link):
    """Seconds per all_reduce of ``nbytes`` float32 (each call after a barrier)."""
    if which == "zmq":
        return _swap_child(rank, addr, port, nbytes, reps)
    lib, dist = _join(which, rank, addr, port, link)
    t = lib.ones(nbytes // 4)
    for _ in range(2):
        dist.all_reduce(t)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    dist.barrier()
    dist.destroy_process_group()
    return times


def _swap_child(rank, addr, port, nbytes, reps):
    """The floor: two pyzmq PAIR sockets that send each other ``nbytes`` at once."""
    import numpy as np
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.linger = 60_000  # the last message may still be leaving when the peer's arrived
    sock.rcvtimeo = sock.sndtimeo = 120_000
    if rank == 0:
        sock.bind(f"tcp://{addr}:{port}")
    else:
        sock.connect(f"tcp://{addr}:{port}")
    buf = np.ones(nbytes // 4, np.float32)
    times = []
    try:
        for i in range(reps + 2):
            sock.send(b"go")   # a barrier: both start together
            sock.recv()
            t0 = time.perf_counter()
            sock.send(buf, copy=False)
            sock.recv(copy=False)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    finally:
        sock.close()
        ctx.term()
    return times


def _ddp_child(which, rank, addr, port, steps, link):
    """DDP of the wide model, one rank per host: (ddp step s, no_sync step s, ddp step CPU
    s, no_sync step CPU s) of each pair, alternating, so drifting load hits both alike.
    CPU is the process's, all its threads (communication's included): on a machine whose
    cores the ranks fill, what communication costs shows in the step unless it hides in
    idle cores, so the CPU it adds says what the ratio would be on a quiet machine."""
    import contextlib
    lib, dist = _join(which, rank, addr, port, link)
    lib.manual_seed(0)
    nn = lib.nn
    layers = []
    for _ in range(8):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers, nn.Linear(1024, 16)))
    opt = lib.optim.Adam(model.parameters(), lr=3e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = lib.randn(128, 1024)          # each rank half of the 256-sample batch
    y = lib.randint(0, 16, (128,))

    def step(sync):
        with (contextlib.nullcontext() if sync else model.no_sync()):
            loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step(True)
        step(False)
    pairs = []
    for i in range(steps):
        took, cpu = {}, {}
        for sync in ((True, False) if i % 2 == 0 else (False, True)):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            step(sync)
            took[sync], cpu[sync] = time.perf_counter() - t0, time.process_time() - c0
        pairs.append((took[True], took[False], cpu[True], cpu[False]))
    dist.barrier()
    dist.destroy_process_group()
    return pairs


CHILDREN = {"all_reduce": _all_reduce_child, "ddp": _ddp_child}


# -- running things on the hosts ---------------------------------------------------------

def _env(extra=None):
    env = bench_launch._env(1)
    env["GLOO_SOCKET_IFNAME"] = "eth0"   # what PyTorch needs across hosts, and no more
    env.update(extra or {})
    return env


def _on_hosts(hosts, argvs, envs=None, timeout=900, cwd=None):
    """Run one command per host (``argvs[i]`` on host ``i % 2``...: a list of (host,
    argv)); their outputs; raises with the output of any that failed."""
    procs = []
    try:
        for i, (host, argv) in enumerate(argvs):
            procs.append(host.popen(argv, env=(envs or [None] * len(argvs))[i] or _env(),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, cwd=cwd))
        deadline = time.monotonic() + timeout
        done = [p.communicate(timeout=max(1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err), (host, argv) in zip(procs, done, argvs):
        if p.returncode != 0:
            raise RuntimeError(f"`{' '.join(map(str, argv[:6]))} ...` on {host.name} failed "
                               f"({p.returncode}):\n{out[-2000:]}{err[-3000:]}")
    return [out for out, _ in done]


def _child_pair(hosts, kind, which, *args):
    """``CHILDREN[kind]`` with rank r on host r; rank 0's result."""
    port = next(PORTS)
    argvs = [(hosts[r], [sys.executable, __file__, "--child", kind,
                         json.dumps([which, r, hosts[0].address, port, *args])])
             for r in (0, 1)]
    out = _on_hosts(hosts, argvs)[0]
    return json.loads(out.strip().splitlines()[-1])


def all_reduce(hosts, which, nbytes, reps, link):
    return statistics.median(_child_pair(hosts, "all_reduce", which, nbytes, reps, link))


def ddp_program(hosts, which, steps, link):
    pairs = _child_pair(hosts, "ddp", which, steps, link)
    return {"ddp_s": statistics.median(p[0] for p in pairs),
            "no_sync_s": statistics.median(p[1] for p in pairs),
            "ratio": statistics.median(p[0] / p[1] for p in pairs),
            "ddp_cpu_s": statistics.median(p[2] for p in pairs),
            "no_sync_cpu_s": statistics.median(p[3] for p in pairs)}


def launch(hosts, overrides, places, steps, warmup, workdir):
    """``distgrad launch wide`` with rank r on host ``places[r]`` (Kubernetes-style env);
    seconds per step (steady state, from the metrics)."""
    run_dir = tempfile.mkdtemp(dir=workdir)
    port = next(PORTS)
    cmd = [sys.executable, "-m", "distgrad", "launch", CONFIGS["wide"], *overrides,
           f"run.steps={steps}", "world.transport=tcp", "world.blas_threads=1",
           "checkpoint.every=0", "run.eval_every=0", "--run-dir", run_dir, "--no-progress",
           "--no-plot"]
    env = {"WORLD_SIZE": str(len(places)), "MASTER_ADDR": hosts[0].name,
           "MASTER_PORT": str(port), "DISTGRAD_WORLD_SECRET": os.urandom(16).hex()}
    _on_hosts(hosts, [(hosts[h], cmd) for h in places],
              [_env(dict(env, RANK=str(r))) for r in range(len(places))], cwd=workdir)
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    batch = next(r["batch_size"] for r in records if r.get("event") == "start")
    times = [r["elapsed"] for r in records if "loss" in r]
    return batch / window_rate(times, batch, warmup)


def torch_gpipe(hosts, micro, steps, warmup, workdir):
    """bench_launch's GPipe program (torch.distributed.pipelining), one stage per host;
    seconds per step."""
    store = os.path.join(tempfile.mkdtemp(dir=workdir), "store")  # a file both hosts see
    script = os.path.join(ROOT, "scripts", "bench_launch.py")
    argvs = [(hosts[r], [sys.executable, script, "--child", "torch-gpipe", str(r), str(micro),
                         str(steps), str(warmup), store]) for r in (0, 1)]
    out = _on_hosts(hosts, argvs)[0]
    return 256 / json.loads(out.strip().splitlines()[-1])["rate"]


# -- the plan, the table -------------------------------------------------------------

def _row_id(row):
    """What ``--only`` calls a row: its part and its key or library, e.g. ``launch:ddp``,
    ``ddp:distgrad``, ``all_reduce:torch``."""
    return f"{row['part']}:{row.get('key') or row.get('which')}"


def _plan(hosts, args, have_torch, workdir):
    """[(row, measure)] for one pair of hosts (those ``--only`` selects)."""
    todo = _all_rows(hosts, args, have_torch, workdir)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {_row_id(row) for row, _ in todo} - {row["part"] for row, _ in todo}
        if unknown:
            raise SystemExit(f"bench_hosts: --only {','.join(sorted(unknown))}: no such row "
                             f"(rows: {', '.join(_row_id(row) for row, _ in todo)}; or a "
                             "part alone)")
        todo = [(row, fn) for row, fn in todo if _row_id(row) in wanted or row["part"] in wanted]
    return todo


def _all_rows(hosts, args, have_torch, workdir):
    link = f"{DELAY} {LINK_RATE}"
    mb = args.mb << 20
    todo = [({"part": "all_reduce", "what": "distgrad process group", "which": "distgrad"},
             partial(all_reduce, hosts, "distgrad", mb, args.reps, link)),
            ({"part": "all_reduce", "what": "raw pyzmq swap (floor)", "which": "zmq"},
             partial(all_reduce, hosts, "zmq", mb, args.reps, None))]
    if have_torch:
        todo.insert(1, ({"part": "all_reduce", "what": "torch gloo (no delay)", "which": "torch"},
                        partial(all_reduce, hosts, "torch", mb, args.reps, None)))
    if args.no_models:
        return todo
    steps, warmup, micro = args.steps, 3, args.micro
    delay = [f'world.simulated_link="{link}"']
    three = [0, 0, 1]  # coordinator and worker 1 on host0, worker 2 on host1
    todo += [
        ({"part": "launch", "what": "ddp, 2 replicas (one per host)", "key": "ddp"},
         partial(launch, hosts, ["world.strategy=ddp", "world.workers=2",
                                 "pipeline.micro_batches=1", *delay], three, steps, warmup,
                 workdir)),
        ({"part": "launch", "what": "one replica alone, 128 samples (no comm)", "key": "alone"},
         partial(launch, hosts, ["world.workers=1", "pipeline.micro_batches=1",
                                 "data.batch_size=128", *delay], [0, 1], steps, warmup,
                 workdir)),
        ({"part": "launch", "what": f"pipeline, 2 stages, gpipe, {micro} micro-batches",
          "key": "pipeline"},
         partial(launch, hosts, ["world.strategy=pipeline", "world.workers=2",
                                 f"pipeline.micro_batches={micro}", "pipeline.schedule=gpipe",
                                 *delay], three, steps, warmup, workdir)),
        ({"part": "launch", "what": f"autograd, 2 stages, {micro} micro-batches",
          "key": "autograd"},
         partial(launch, hosts, ["world.strategy=autograd", "world.workers=2",
                                 f"pipeline.micro_batches={micro}", *delay], three, steps,
                 warmup, workdir)),
        ({"part": "ddp", "what": "distgrad DDP program, 1 rank per host", "which": "distgrad"},
         partial(ddp_program, hosts, "distgrad", args.ddp_steps, link))]
    if have_torch:
        todo += [
            ({"part": "launch", "what": f"torch GPipe over gloo, 2 stages, {micro} micro-batches",
              "key": "torch_gpipe"}, partial(torch_gpipe, hosts, micro, steps, warmup, workdir)),
            ({"part": "ddp", "what": "torch DDP over gloo, 1 rank per host", "which": "torch"},
             partial(ddp_program, hosts, "torch", args.ddp_steps, None))]
    return todo


def measure(bandwidth, args, have_torch):
    from distgrad.testing.hosts import SimulatedHosts, parse_rate
    workdir = tempfile.mkdtemp(prefix="bench-hosts-")
    try:
        with SimulatedHosts(2, bandwidth=bandwidth, private_shm=True) as hosts:
            todo = _plan(hosts, args, have_torch, workdir)
            results = [[] for _ in todo]
            errors = [None] * len(todo)
            for _ in range(args.rounds):
                for i, (row, fn) in enumerate(todo):
                    try:
                        results[i].append(fn())
                        # as it goes, so a long run that is stopped still says something
                        print(f"bench_hosts: {bandwidth}, {row['what']}: {results[i][-1]}",
                              file=sys.stderr, flush=True)
                    except Exception as e:  # noqa: BLE001 - one candidate's failure is a row
                        errors[i] = f"{type(e).__name__}: {e}"
                        print(f"bench_hosts: {row['what']} at {bandwidth} failed: {e}",
                              file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rate = parse_rate(bandwidth) / 8   # bytes/s
    rows = []
    for (row, _), got, error in zip(todo, results, errors):
        row = dict(row, bandwidth=bandwidth, rounds=got)
        if not got:
            rows.append(dict(row, error=error))
            continue
        if row["part"] == "ddp":
            for key in ("ddp_s", "no_sync_s", "ratio", "ddp_cpu_s", "no_sync_cpu_s"):
                row[key] = statistics.median(g[key] for g in got)
        else:
            row["seconds"] = statistics.median(got)
        if row["part"] == "all_reduce":
            row["bus_bytes_per_s"] = (args.mb << 20) / row["seconds"]  # 2 ranks: 2(n-1)/n = 1
            row["of_link"] = row["bus_bytes_per_s"] / rate
        rows.append(row)
    return rows


def _table(rows, mb):
    lines = []
    for bw in dict.fromkeys(r["bandwidth"] for r in rows):
        here = [r for r in rows if r["bandwidth"] == bw and "error" not in r]
        lines += [f"  FAILED: {r['what']} at {bw}: {r['error'].splitlines()[0][:160]}" for r in rows
                  if r["bandwidth"] == bw and "error" in r]
        lines.append(f"\n2 hosts at {bw} (tbf), {DELAY} simulated delay on distgrad's messages")
        if any(r["part"] == "all_reduce" for r in here):
            lines.append(f"  {f'all_reduce, {mb} MB':58s}{'ms':>9s}{'bus MB/s':>10s}"
                         f"{'of link':>9s}")
        for r in here:
            if r["part"] == "all_reduce":
                lines.append(f"  {r['what']:58s}{r['seconds'] * 1e3:9.1f}"
                             f"{r['bus_bytes_per_s'] / 1e6:10.0f}{r['of_link']:9.0%}")
        alone = next((r["seconds"] for r in here if r.get("key") == "alone"), None)
        if any(r["part"] == "launch" for r in here):
            lines.append(f"  {'wide under distgrad launch (torch: its own programs)':58s}"
                         f"{'step ms':>9s}{'x alone' if alone else '':>10s}")
            for r in here:
                if r["part"] == "launch":
                    lines.append(f"  {r['what']:58s}{r['seconds'] * 1e3:9.0f}" +
                                 (f"{r['seconds'] / alone:10.2f}" if alone else ""))
        if any(r["part"] == "ddp" for r in here):
            lines.append(f"  {'DDP of wide, each step beside a no_sync() step':58s}"
                         f"{'step ms':>9s}{'no_sync':>10s}{'ratio':>9s}"
                         f"{'CPU ms':>9s}{'no_sync':>9s}{'ratio':>7s}")
            for r in here:
                if r["part"] == "ddp":
                    lines.append(f"  {r['what']:58s}{r['ddp_s'] * 1e3:9.0f}"
                                 f"{r['no_sync_s'] * 1e3:10.0f}{r['ratio']:9.2f}"
                                 f"{r['ddp_cpu_s'] * 1e3:9.0f}{r['no_sync_cpu_s'] * 1e3:9.0f}"
                                 f"{r['ddp_cpu_s'] / r['no_sync_cpu_s']:7.2f}")
    return lines


def _verdict(rows):
    met, lines = {}, []
    rows = [r for r in rows if "error" not in r]

    def get(bw, **kw):
        return next((r for r in rows if r["bandwidth"] == bw
                     and all(r.get(k) == v for k, v in kw.items())), None)
    ours = get("1Gbit/s", part="all_reduce", which="distgrad")
    if ours:
        target = TARGETS["all_reduce_link_min_1g"]
        met["all_reduce_1g"] = ours["of_link"] >= target
        lines.append(f"all_reduce at 1 Gbit/s: {ours['of_link']:.0%} of the link "
                     f"(target >= {target:.0%}): {'met' if met['all_reduce_1g'] else 'NOT met'}")
    ours, gloo = get("10Gbit/s", part="all_reduce", which="distgrad"), \
        get("10Gbit/s", part="all_reduce", which="torch")
    if ours and gloo:
        target, x = TARGETS["all_reduce_vs_gloo_min_10g"], gloo["seconds"] / ours["seconds"]
        met["all_reduce_vs_gloo_10g"] = x >= target
        lines.append(f"all_reduce at 10 Gbit/s: {x:.2f}x gloo's bandwidth (target >= "
                     f"{target}): {'met' if met['all_reduce_vs_gloo_10g'] else 'NOT met'}")
    ours, theirs = get("10Gbit/s", part="ddp", which="distgrad"), \
        get("10Gbit/s", part="ddp", which="torch")
    if ours:
        target = TARGETS["ddp_vs_no_comm_max_10g"]
        ok = ours["ratio"] <= target and (theirs is None or ours["ratio"] < theirs["ratio"])
        met["ddp_10g"] = ok
        lines.append(f"DDP of wide at 10 Gbit/s: step {ours['ratio']:.2f}x the no_sync step "
                     f"(target <= {target}" + (f", below torch's {theirs['ratio']:.2f}"
                                               if theirs else "") +
                     f"): {'met' if ok else 'NOT met'}")
    for bw in dict.fromkeys(r["bandwidth"] for r in rows):
        launches = [r for r in rows if r["bandwidth"] == bw and r["part"] == "launch"
                    and r["key"] in ("ddp", "pipeline", "autograd", "torch_gpipe")]
        if launches:
            best = min(launches, key=lambda r: r["seconds"])
            lines.append(f"fastest step of wide at {bw}: {best['what']} "
                         f"({best['seconds'] * 1e3:.0f} ms)")
    return met, lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 1 Gbit/s only, 1 MB, 1 round, no models")
    parser.add_argument("--bandwidth", action="append",
                        help=f"a link rate (repeatable; default: {', '.join(BANDWIDTHS)})")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=64, help="all_reduce size in MB (64)")
    parser.add_argument("--reps", type=int, default=5, help="all_reduce calls per run (5)")
    parser.add_argument("--steps", type=int, default=20, help="steps per launch (20)")
    parser.add_argument("--ddp-steps", type=int, default=8, help="DDP step pairs per run (8)")
    parser.add_argument("--micro", type=int, default=4, help="pipeline micro-batches (4)")
    parser.add_argument("--no-models", action="store_true", help="all_reduce only")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--only", help="rows to run, comma-separated: a part (all_reduce, "
                        "launch, ddp) or part:key (launch:ddp, launch:alone, ddp:distgrad, "
                        "ddp:torch, all_reduce:zmq, ...)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, params = args.child
        print(json.dumps(CHILDREN[kind](*json.loads(params))))
        return 0
    if args.quick:
        args.bandwidth = args.bandwidth or ["1Gbit/s"]
        args.mb, args.reps, args.rounds, args.no_models = 1, 2, 1, True
    from distgrad.testing.hosts import unavailable
    why = unavailable()
    if why is not None:
        print(f"bench_hosts: no simulated hosts here: {why}")
        print(json.dumps({"bench": "hosts", "skipped": why}))
        return 0
    have_torch = not args.no_torch
    if have_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            have_torch = False
    rows = []
    for bandwidth in args.bandwidth or BANDWIDTHS:
        rows += measure(bandwidth, args, have_torch)
    print(f"distgrad across 2 simulated hosts ({bench_launch._cores()} cores; medians of "
          f"{args.rounds} rounds, candidates interleaved; private /dev/shm per host)")
    for line in _table(rows, args.mb):
        print(line)
    met, lines = _verdict(rows)
    if not have_torch:
        print("PyTorch is not installed: its rows are left out")
    for line in lines:
        print(line)
    print(json.dumps({"bench": "hosts", "delay": DELAY, "targets": TARGETS, "met": met,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_hosts"):  # with --record: its section of docs/performance.md
        sys.exit(main())
