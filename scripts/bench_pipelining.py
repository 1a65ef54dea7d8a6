"""Throughput of ``torch.distributed.pipelining`` programs on distgrad and on PyTorch: every
schedule on 2 ranks x 1 BLAS thread, against one process with 1 and with 2 BLAS threads.

    python scripts/bench_pipelining.py              # wide: 8 x 1024 layers, batch 256
    python scripts/bench_pipelining.py --quick      # a small model, one round (a smoke test)

The model is ``configs/wide.toml``'s (eight 1024 x 1024 linear layers with ReLU and a
16-way head, Adam, cross-entropy, batch 256), each schedule with 2, 4 and 8 micro-batches
(``--micro``: fewer, larger micro-batches run the BLAS closer to its whole-batch speed;
more make a smaller bubble). Each rank is a process of
its own, pinned to a core of its own, one BLAS thread; they meet in a gloo process group
(``init_process_group`` from ``MASTER_ADDR``/``MASTER_PORT``). The pipeline program is the
same on both frameworks, its ``import torch`` swapped for ``import distgrad as torch``.
Schedules with two stages per rank (interleaved, Looped BFS, interleaved zero-bubble, ZB-V,
DualPipeV) cut the model into 4 stages, GPipe and 1F1B into 2. distgrad's ranks tolerate 30 s
without a heartbeat (a loaded machine can leave a rank seconds without a core); a run that
fails anyway is reported on stderr and left out of the table.

Beside them, ``distgrad launch`` runs of ``configs/wide.toml`` on the same schedule classes
(``--launch``): there a B schedule's linear weights get their gradients in one product
per weight at the end of the step (``pipeline.defer_weight_grads``), which the BLAS runs
at its whole-batch speed.

For distgrad's runs the bubble is measured: each rank times its compute actions (F, B,
I, W: the schedule's action observer), and the bubble is the share of a step's time (the
schedule's, without the optimizer step) it spends not computing, averaged over ranks.
Beside it, two models: the schedule's critical path with the measured action times
(every rank runs its list in order, an action starting when its inputs are there, messages
free: what the schedule alone costs), and the textbook formula where there is one
((p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(vm+p-1) interleaved, ZB-H1's
(p-1)(F+B-W)/(vm(F+B+W)+(p-1)(F+B-W)) with a stage's mean action times).

Every measurement runs once per round, rounds one after the other (a burst of load from
elsewhere hits one repetition of each); the table shows medians over rounds of the median
over five windows of steps, and each process's CPU time per step (what the kernels and
the messages cost, whatever the load). Prints a table and one JSON line; the machine's
load average is printed with them (a busy machine's numbers are noisy: compare same-run
ratios).
"""
import argparse
import importlib
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDE = os.path.join(ROOT, "configs", "wide.toml")
sys.path.insert(0, ROOT)

from bench_launch import _env as launch_env, pipeline as launch, window_rate  # noqa: E402

SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
             "ZBVZeroBubble", "DualPipeV"]
TWO_PER_RANK = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                "DualPipeV")
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
# the same schedule classes under `distgrad launch`, where linear weights' gradients of
# B schedules wait for one product per weight (pipeline.defer_weight_grads)
LAUNCHES = "interleaved1f1b:2:2,zbvzerobubble:2:2,1f1b:1:4"
TARGETS = {"best_vs_one_thread_min": 1.55, "best_vs_two_threads_min": 0.95,
           "vs_torch_min": 1.0, "bubble_points_max": 5.0}


def _env(threads):
    env = launch_env(threads)
    env.pop("DISTGRAD_AS_TORCH", None)
    return env


# -- the program (children) --------------------------------------------------------

def _model(torch, width, layers, classes):
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(width, classes))


def _data(torch, width, classes, batch):
    import numpy as np
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, width)).astype("float32")
    y = rng.integers(0, classes, batch)
    return torch.from_numpy(x), torch.from_numpy(y)


def _cut(model, n_stages):
    """``n_stages`` contiguous slices of the Sequential with equal linear layers each."""
    layers = list(model)
    linear = [i for i, m in enumerate(layers) if type(m).__name__ == "Linear"]
    per = (len(linear) - 1) // n_stages  # the head rides with the last stage
    bounds = [linear[k * per] for k in range(n_stages)] + [len(layers)]
    return [model[a:b] for a, b in zip(bounds, bounds[1:])]


def child_single(framework, threads, args):
    torch = importlib.import_module(framework)
    if framework == "torch":
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _model(torch, args.width, args.layers, args.classes)
    x, y = _data(torch, args.width, args.classes, args.batch)
    loss_fn, opt = torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), lr=3e-4)
    times, cpu = [], []
    for _ in range(args.steps):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter())
        cpu.append(time.process_time())
    print(json.dumps({"rate": window_rate(times, args.batch, args.warmup),
                      "cpu_ms": _cpu_per_step(cpu, args.warmup)}))


def child_pipeline(framework, rank, name, port, args):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
    torch = importlib.import_module(framework)
    importlib.import_module(f"{framework}.distributed.pipelining")
    schedules = importlib.import_module(f"{framework}.distributed.pipelining.schedules")
    if framework == "torch":
        torch.set_num_threads(1)
    dist = torch.distributed
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    options = {}
    if framework == "distgrad":  # a loaded machine can leave a rank seconds without a core
        from distgrad.distributed.rpc import RpcBackendOptions
        options["pg_options"] = RpcBackendOptions(heartbeat_interval=1.0, heartbeat_timeout=30)
    dist.init_process_group("gloo", rank=rank, world_size=2, **options)
    torch.manual_seed(0)
    n_stages = 4 if name in TWO_PER_RANK else 2
    parts = _cut(_model(torch, args.width, args.layers, args.classes), n_stages)
    if n_stages == 2:
        mine = [rank]
    elif name in V_SHAPED:
        mine = [rank, 3 - rank]
    else:
        mine = [rank, rank + 2]
    pipe = torch.distributed.pipelining
    stages = [pipe.PipelineStage(parts[i], i, n_stages, torch.device("cpu")) for i in mine]
    schedule = schedules.get_schedule_class(name)(
        stages[0] if name in ("GPipe", "1F1B") else stages, args.micro,
        loss_fn=torch.nn.CrossEntropyLoss())
    actions = []
    if framework == "distgrad":  # time each compute action of the steady steps
        from contextlib import contextmanager

        @contextmanager
        def observe(rank_, action):
            t0 = time.perf_counter()
            yield
            actions.append((action.computation_type.value, action.stage_index,
                            t0, time.perf_counter()))
        schedule._action_observer = observe
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.Adam(params, lr=3e-4)
    x, y = _data(torch, args.width, args.classes, args.batch)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    times, spans, cpu = [], [], []
    for i in range(args.steps):
        t0 = time.perf_counter()
        schedule.step(*((x,) if first else ()), **({"target": y, "losses": []} if last else {}))
        spans.append((t0, time.perf_counter()))
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter())
        cpu.append(time.process_time())
    dist.barrier()
    dist.destroy_process_group()
    out = {"rank": rank, "rate": window_rate(times, args.batch, args.warmup),
           "cpu_ms": _cpu_per_step(cpu, args.warmup)}
    if actions:
        out["bubble"] = _measured_bubble(actions, spans[args.warmup:])
        out["durations"] = _mean_durations(actions, spans[args.warmup][0])
    print(json.dumps(out))


def _cpu_per_step(cpu, warmup):
    """This process's CPU time per steady step, in ms (all its threads: compute and the
    messages' I/O)."""
    return 1000 * (cpu[-1] - cpu[warmup]) / max(len(cpu) - 1 - warmup, 1)


def _measured_bubble(actions, spans):
    """The share of the steps' schedule time without compute, over the steady steps."""
    total = sum(b - a for a, b in spans)
    busy = sum(e - s for _, _, s, e in actions if s >= spans[0][0])
    return 1 - busy / total


def _mean_durations(actions, since):
    sums = {}
    for kind, stage, s, e in actions:
        if s >= since:
            key = f"{stage}{kind}"
            total, n = sums.get(key, (0.0, 0))
            sums[key] = (total + e - s, n + 1)
    return {k: t / n for k, (t, n) in sums.items()}


# -- models of the bubble ------------------------------------------------------------

def critical_path_bubble(name, micro, durations):
    """The bubble of the schedule's action lists run with these action times (s per
    "<stage><kind>"), every rank in its order, an action once its inputs exist."""
    from distgrad.distributed.pipelining.schedules import get_schedule_class
    from distgrad.distributed.pipelining.stage import PipelineStage
    import distgrad

    class _Ranks:
        def __init__(self, rank):
            self.rank, self.size = rank, 2
    n_stages = 4 if name in TWO_PER_RANK else 2
    cls = get_schedule_class(name)
    st = [PipelineStage(distgrad.nn.Linear(1, 1), i, n_stages, _channel=_Ranks(0))
          for i in ([0] if n_stages == 2 else [0, 3] if name in V_SHAPED else [0, 2])]
    order = cls(st[0] if name in ("GPipe", "1F1B") else st, micro)._lowered()
    rank_of = {}
    lists = {}
    for r, items in order.items():
        lists[r] = [x for a in items for x in (a.sub_actions or (a,))
                    if x.computation_type.value in "FBIW"]
        for a in lists[r]:
            rank_of[a.stage_index] = r
    done, free, pos = {}, {r: 0.0 for r in lists}, {r: 0 for r in lists}
    busy = {r: 0.0 for r in lists}

    def ready(a):
        s, k, mb = a.stage_index, a.computation_type.value, a.microbatch_index
        need = {"F": [(s - 1, "F")] if s else [], "W": [(s, "I")],
                "B": [(s + 1, "B"), (s + 1, "I")] if s < n_stages - 1 else [(s, "F")],
                "I": [(s + 1, "B"), (s + 1, "I")] if s < n_stages - 1 else [(s, "F")]}[k]
        if k in "BI" and s < n_stages - 1:  # either kind of backward of the next stage
            ends = [done.get((t, kk, mb)) for t, kk in need]
            ends = [e for e in ends if e is not None]
            return max(ends) if ends else None
        ends = [done.get((t, kk, mb)) for t, kk in need]
        return None if any(e is None for e in ends) else max(ends, default=0.0)
    while any(pos[r] < len(lists[r]) for r in lists):
        moved = False
        for r in lists:
            while pos[r] < len(lists[r]):
                a = lists[r][pos[r]]
                at = ready(a)
                if at is None:
                    break
                d = durations.get(f"{a.stage_index}{a.computation_type.value}", 0.0)
                start = max(free[r], at)
                free[r] = start + d
                busy[r] += d
                done[(a.stage_index, a.computation_type.value, a.microbatch_index)] = free[r]
                pos[r] += 1
                moved = True
        if not moved:
            raise RuntimeError(f"{name}: the model of the schedule is stuck")
    span = max(free.values())
    return 1 - statistics.mean(busy.values()) / span


def textbook_bubble(name, micro, durations):
    p, v = 2, 2 if name in TWO_PER_RANK else 1
    if name in ("GPipe", "1F1B"):
        return (p - 1) / (micro + p - 1)
    if name in ("Interleaved1F1B", "LoopedBFS"):
        return (p - 1) / (v * micro + p - 1)
    if name == "InterleavedZeroBubble":
        def mean(kind):
            vals = [t for k, t in durations.items() if k.endswith(kind)]
            return statistics.mean(vals) if vals else 0.0
        f, b, w = mean("F"), mean("I"), mean("W")  # per stage (a v-th of a rank's layers)
        return (p - 1) * (f + b - w) / (v * micro * (f + b + w) + (p - 1) * (f + b - w))
    return None


# -- the parent ------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, threads, timeout=900):
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(threads),
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:6])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def single(framework, threads, argv):
    return _run([sys.executable, __file__, *argv, "--child", "single", framework,
                 str(threads)], threads)


def _valid(name, micro):
    """Whether the schedule takes ``micro`` micro-batches on 2 ranks (PyTorch's rules)."""
    return not ((name == "1F1B" and micro < 2) or (name == "DualPipeV" and micro < 4))


def pipeline(framework, name, micro, argv):
    port = _free_port()
    env = dict(_env(1), DISTGRAD_WORLD_SECRET=secrets.token_hex(32))  # a closed world
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--child", "pipe", framework,
                               str(r), name, str(port), str(micro)],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{framework} {name} failed:\n"
                           + "\n".join(err[-2000:] for _, err in outs))
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    result = {"rate": min(r["rate"] for r in ranks),
              "cpu_ms": [r["cpu_ms"] for r in ranks]}
    if "bubble" in ranks[0]:
        result["bubble"] = statistics.mean(r["bubble"] for r in ranks)
        result["durations"] = {k: v for r in ranks for k, v in r["durations"].items()}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--micro", default="2,4,8",
                        help="micro-batch counts to run every schedule with (default 2,4,8)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--schedule", action="append", choices=SCHEDULES)
    parser.add_argument("--no-torch", action="store_true", help="distgrad only")
    parser.add_argument("--launch", default=LAUNCHES,
                        help="distgrad launch runs of configs/wide.toml beside them, as "
                             "schedule:virtual stages:micro-batches,... ('' for none)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.warmup, args.width = 1, 8, 2, 64
    micros = [int(m) for m in str(args.micro).split(",")]
    args.micro = micros[0]
    shared = [f"--steps={args.steps}", f"--warmup={args.warmup}",
              f"--width={args.width}", f"--layers={args.layers}", f"--batch={args.batch}",
              f"--classes={args.classes}"]
    if args.child:
        mode, framework, *rest = args.child
        if mode == "single":
            return child_single(framework, int(rest[0]), args)
        args.micro = int(rest[3])
        return child_pipeline(framework, int(rest[0]), rest[1], int(rest[2]), args)
    names = args.schedule or SCHEDULES
    try:
        importlib.import_module("torch")
        frameworks = ["distgrad"] if args.no_torch else ["distgrad", "torch"]
    except ImportError:
        frameworks = ["distgrad"]
    todo = []
    for fw in frameworks:
        for threads in (1, 2):
            todo.append(({"framework": fw, "what": f"one process, {threads} BLAS thread"
                          + ("s" if threads > 1 else ""), "threads": threads},
                         lambda fw=fw, t=threads: single(fw, t, shared)))
        for name in names:
            for m in micros:
                if _valid(name, m):
                    todo.append(({"framework": fw, "what": f"{name}, {m} micro-batches",
                                  "schedule": name, "micro": m},
                                 lambda fw=fw, n=name, m=m: pipeline(fw, n, m, shared)))
    workdir = tempfile.mkdtemp(prefix="bench-pipelining-")
    for item in filter(None, args.launch.split(",")):
        name, virtual, m = item.split(":")
        overrides = [f"pipeline.schedule={name}", f"pipeline.virtual_stages={virtual}",
                     f"pipeline.micro_batches={m}", f"data.batch_size={args.batch}",
                     f"model.kwargs.sizes={[args.width] * (args.layers + 1) + [args.classes]}",
                     f"data.kwargs.dim={args.width}"]
        todo.append(({"framework": "distgrad", "what": f"launch {name}, v{virtual}, {m} mb",
                      "launch": True},
                     lambda o=overrides: {"rate": launch(WIDE, o, args.steps, args.warmup,
                                                        workdir), "cpu_ms": []}))
    load_before = os.getloadavg()
    results = [[] for _ in todo]
    for _ in range(args.rounds):
        for i, (row, measure) in enumerate(todo):
            try:
                results[i].append(measure())
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # the others go on
                print(f"{row['framework']} {row['what']}: {str(e)[-600:]}", file=sys.stderr)
    todo, results = zip(*[(t, r) for t, r in zip(todo, results) if r]) if any(results) \
        else ((), ())
    load_after = os.getloadavg()
    shutil.rmtree(workdir, ignore_errors=True)
    rows = []
    for (row, _), got in zip(todo, results):
        row = dict(row, rate=statistics.median(g["rate"] for g in got),
                   rounds=[g["rate"] for g in got])
        cpu = [g["cpu_ms"] if isinstance(g["cpu_ms"], list) else [g["cpu_ms"]] for g in got]
        row["cpu_ms"] = [statistics.median(c[i] for c in cpu) for i in range(len(cpu[0]))]
        if "bubble" in got[0]:
            best = min(got, key=lambda g: abs(g["rate"] - row["rate"]))
            row["bubble"] = statistics.median(g["bubble"] for g in got)
            row["bubble_model"] = critical_path_bubble(row["schedule"], row["micro"],
                                                       best["durations"])
            row["bubble_textbook"] = textbook_bubble(row["schedule"], row["micro"],
                                                     best["durations"])
        rows.append(row)
    for row in rows:
        base = {t: next(r["rate"] for r in rows if r["framework"] == row["framework"]
                        and r.get("threads") == t) for t in (1, 2)}
        row["vs_one_thread"], row["vs_two_threads"] = row["rate"] / base[1], row["rate"] / base[2]
    return _report(rows, args, names, load_before, load_after)


def _report(rows, args, names, load_before, load_after):
    print(f"torch.distributed.pipelining programs, {args.layers} x {args.width} layers, batch "
          f"{args.batch}; 2 ranks x 1 BLAS thread (pinned) vs one "
          f"process; medians of {args.rounds} rounds; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after ({os.cpu_count()} cores)")
    print(f"{'framework':9s} {'what':38s} {'samples/s':>10s} {'x 1 thr':>8s} {'x 2 thr':>8s} "
          f"{'bubble':>7s} {'model':>7s} {'formula':>8s} {'CPU ms/step':>13s}")
    for r in rows:
        def pct(k):
            return f"{100 * r[k]:6.1f}%" if r.get(k) is not None else f"{'':7s}"
        cpu = "+".join(f"{c:.0f}" for c in r["cpu_ms"])
        print(f"{r['framework']:9s} {r['what']:38s} {r['rate']:10.1f} {r['vs_one_thread']:8.2f} "
              f"{r['vs_two_threads']:8.2f} {pct('bubble')} {pct('bubble_model')} "
              f"{pct('bubble_textbook'):>8s} {cpu:>13s}")
    ours = [r for r in rows if r["framework"] == "distgrad" and "schedule" in r]
    best = max(ours + [r for r in rows if r.get("launch")], key=lambda r: r["rate"])
    met = {"best_vs_one_thread": best["vs_one_thread"] >= TARGETS["best_vs_one_thread_min"],
           "best_vs_two_threads": best["vs_two_threads"] >= TARGETS["best_vs_two_threads_min"],
           "bubble_within_points": all(abs(r["bubble"] - r["bubble_model"]) * 100
                                       <= TARGETS["bubble_points_max"] for r in ours)}
    lines = [f"best: {best['what']}, {best['vs_one_thread']:.2f}x one thread (target >= "
             f"{TARGETS['best_vs_one_thread_min']}), {best['vs_two_threads']:.2f}x two threads "
             f"(target >= {TARGETS['best_vs_two_threads_min']})"]
    theirs = {r["what"]: r for r in rows if r["framework"] == "torch" and "schedule" in r}
    if theirs:
        ratios = {r["what"]: r["rate"] / theirs[r["what"]]["rate"] for r in ours
                  if r["what"] in theirs}
        met["vs_torch"] = all(v >= TARGETS["vs_torch_min"] for v in ratios.values())
        lines.append("distgrad / PyTorch, same schedule and micro-batches: " + ", ".join(
            f"{k} {v:.2f}" for k, v in ratios.items()))
    for line in lines:
        print(line)
    print("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in met.items()))
    print(json.dumps({"bench": "pipelining", "rows": rows, "targets": TARGETS, "met": met,
                      "load": [load_before[0], load_after[0]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
