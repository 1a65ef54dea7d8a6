"""Throughput of ``distgrad launch`` in both strategies, also over simulated links, vs one process.

    python scripts/bench_launch.py            # the full table (long: half an hour on 2 cores)
    python scripts/bench_launch.py --quick    # fewer steps, for a smoke test
    python scripts/bench_launch.py --size wide --links none --rounds 1

Two sizes: ``configs/quickstart.toml`` (a 2-64-64-64-2 network, where the messages
between stages dominate) and ``configs/wide.toml`` (eight 1024x1024 layers, batch
256, where the stages' compute dominates). Each runs as a real launch (the
coordinator and one process per stage, one BLAS thread each) with 2 and 4 stages,
with and without micro-batches, in both strategies: ``pipeline`` (stages hand each
other activations and gradients, GPipe or 1F1B) and ``autograd`` (stages are remote
modules; the coordinator sends micro-batches through them as RPC futures, runs one
``dist_autograd.backward`` and steps a ``DistributedOptimizer``; its order is
GPipe's, so it has no schedule); and as 2 data-parallel replicas (``world.strategy
= "ddp"``). Pipelines of 2 stages also run over simulated links between hosts
(``world.simulated_link``: "200us 10Gbit/s" and "2ms 1Gbit/s"), where more
micro-batches and 1F1B should win back what latency costs. Samples/s (steady state,
read from the run's metrics) are compared with the same training in one process
(same model, batches and optimizer: ``distgrad.launch.local``) with one BLAS
thread and with all cores. With torch installed, PyTorch's own pipelining (GPipe
over gloo, one thread per stage) and its DDP over gloo (2 ranks, one thread each)
run beside it on the wide model, against torch in one process with one thread.

A run's rate is the median over five windows of its steady-state steps; every
configuration runs once per round (``--rounds``, default 3) and the table shows the
median over rounds, so a burst of load from elsewhere on the machine moves one
repetition of each, not one configuration. Prints a table and one JSON line.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIGS = {"quickstart": os.path.join(ROOT, "configs", "quickstart.toml"),
           "wide": os.path.join(ROOT, "configs", "wide.toml")}
TARGETS = {"quickstart_slowdown_max": 1.3, "wide_vs_one_thread_min": 1.6,
           "wide_vs_all_cores_min": 0.9,
           # issue "distribution that pays": wide, 2 stages, 4 micro-batches, in both
           # strategies; autograd against pipeline; quickstart, 2 stages
           "wide_2_stages_4_micro_min": 1.35, "autograd_vs_pipeline_min": 0.9,
           "quickstart_2_stages_min": 0.5}
LINKS = {"none": None, "200us": "200us 10Gbit/s", "2ms": "2ms 1Gbit/s"}


def _cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _env(threads):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def window_rate(times, batch, warmup):
    """Median samples/s over five windows of the steps after ``warmup`` (times: per step)."""
    times = times[warmup:]
    n = len(times) - 1
    if n < 5:
        return batch * n / (times[-1] - times[0])
    edges = [round(i * n / 5) for i in range(6)]
    return statistics.median(batch * (b - a) / (times[b] - times[a])
                             for a, b in zip(edges[:-1], edges[1:]))


# -- one process ------------------------------------------------------------------

def _single_child(config, overrides, steps, warmup):
    from distgrad.launch.config import load_config
    from distgrad.launch.local import train_in_one_process
    cfg = load_config(config, overrides)
    times = []
    train_in_one_process(cfg, steps, on_step=lambda step, loss: times.append(time.perf_counter()))
    print(json.dumps({"rate": window_rate(times, cfg["data"]["batch_size"], warmup)}))


def single_process(config, overrides, threads, steps, warmup):
    out = subprocess.run([sys.executable, __file__, "--child", "single", config,
                          json.dumps(overrides), str(steps), str(warmup)],
                         capture_output=True, text=True, env=_env(threads), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


# -- a launch ---------------------------------------------------------------------

def pipeline(config, overrides, steps, warmup, workdir):
    run_dir = tempfile.mkdtemp(dir=workdir)
    cmd = [sys.executable, "-m", "distgrad", "launch", config, *overrides, f"run.steps={steps}",
           "world.blas_threads=1", "checkpoint.every=0", "run.eval_every=0",
           "--run-dir", run_dir, "--no-progress", "--no-plot"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(1), cwd=workdir)
    if done.returncode != 0:
        raise RuntimeError(f"launch failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    batch = next(r["batch_size"] for r in records if r.get("event") == "start")
    times = [r["elapsed"] for r in records if "loss" in r]
    return window_rate(times, batch, warmup)


# -- PyTorch: GPipe over gloo, one thread per stage ---------------------------------

def _torch_model(torch):
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(1024, 16))


def _torch_child(mode, rank, micro, steps, warmup, store):
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = _torch_model(torch)
    x = torch.randn(256, 1024)
    y = torch.randint(0, 16, (256,))
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    if mode in ("torch-single", "torch-ddp"):
        if mode == "torch-ddp":  # each rank half of the batch, gradients averaged by gloo
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                    world_size=2)
            model = torch.nn.parallel.DistributedDataParallel(model)
            x, y = x[rank::2], y[rank::2]
        opt = torch.optim.Adam(model.parameters(), lr=3e-4)
        for _ in range(steps):
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter())
        if mode == "torch-ddp":
            dist.barrier()
            dist.destroy_process_group()
        if rank == 0:
            print(json.dumps({"rate": window_rate(times, 256, warmup)}))
        return
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    stage_module = model[:8] if rank == 0 else model[8:]
    stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, micro, loss_fn=loss_fn)
    opt = torch.optim.Adam(stage_module.parameters(), lr=3e-4)
    for _ in range(steps):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter())
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"rate": window_rate(times, 256, warmup)}))


def torch_run(mode, micro, steps, warmup, workdir):
    store = os.path.join(tempfile.mkdtemp(dir=workdir), "store")
    ranks = [0] if mode == "torch-single" else [0, 1]
    procs = [subprocess.Popen([sys.executable, __file__, "--child", mode, str(r), str(micro),
                               str(steps), str(warmup), store], stdout=subprocess.PIPE,
                              text=True, env=_env(1)) for r in ranks]
    try:
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"torch {mode} failed")
    return json.loads(outs[0].strip().splitlines()[-1])["rate"]


# -- the table --------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke test)")
    parser.add_argument("--size", choices=sorted(CONFIGS), action="append",
                        help="only this size (repeatable; default: both)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="repetitions of every measurement, medians reported (default 3)")
    parser.add_argument("--strategy", choices=("pipeline", "autograd"), action="append",
                        help="only this strategy (repeatable; default: both)")
    parser.add_argument("--links", choices=sorted(LINKS), action="append",
                        help="only these links: none, 200us (10 Gbit/s), 2ms (1 Gbit/s) "
                             "(repeatable; default: all)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, *rest = args.child
        if mode == "single":
            config, overrides, steps, warmup = rest
            return _single_child(config, json.loads(overrides), int(steps), int(warmup))
        rank, micro, steps, warmup, store = rest
        return _torch_child(mode, int(rank), int(micro), int(steps), int(warmup), store)

    cores = _cores()
    # (stages, micro-batches, schedule) per size, run in both strategies (the autograd
    # strategy has no schedule: it runs the gpipe rows only); ``linked``: also over links
    plan = {"quickstart": {"steps": 120 if args.quick else 400, "warmup": 20,
                           "runs": [(2, 1, "gpipe"), (2, 4, "gpipe"), (4, 1, "gpipe"),
                                    (4, 4, "gpipe")],
                           "linked": [(2, 1, "gpipe"), (2, 4, "gpipe"), (2, 4, "1f1b")]},
            "wide": {"steps": 10 if args.quick else 24, "warmup": 3,
                     "runs": [(2, 1, "gpipe"), (2, 4, "gpipe"), (2, 8, "gpipe"),
                              (2, 8, "1f1b"), (4, 1, "gpipe"), (4, 8, "gpipe")],
                     "linked": [(2, 4, "gpipe"), (2, 8, "gpipe"), (2, 8, "1f1b")]}}
    plan = {size: p for size, p in plan.items() if not args.size or size in args.size}
    strategies = args.strategy or ["pipeline", "autograd"]
    links = args.links or list(LINKS)
    workdir = tempfile.mkdtemp(prefix="bench-launch-")
    # every measurement, as (row, how to take it); all are taken once per round, rounds
    # one after the other, so a burst of load elsewhere hits one repetition of each
    todo = []
    for size, p in plan.items():
        config, steps, warmup = CONFIGS[size], p["steps"], p["warmup"]
        for threads in (1, cores):
            todo.append(({"size": size, "what": f"one process, {threads} BLAS thread"
                          + ("s" if threads > 1 else ""), "threads": threads},
                         partial(single_process, config, ["pipeline.micro_batches=1"],
                                 threads, steps, warmup)))
        if "none" in links:
            todo.append(({"size": size, "what": "ddp, 2 replicas", "replicas": 2},
                         partial(pipeline, config, ["world.strategy=ddp", "world.workers=2",
                                                    "pipeline.micro_batches=1"],
                                 steps, warmup, workdir)))
        runs = [(link, run) for link in links
                for run in (p["runs"] if link == "none" else p["linked"])]
        for strategy in strategies:
            for link, (stages, micro, schedule) in runs:
                if strategy == "autograd" and schedule != "gpipe":
                    continue
                overrides = [f"world.strategy={strategy}", f"world.workers={stages}",
                             f"pipeline.micro_batches={micro}", f"pipeline.schedule={schedule}"]
                if LINKS[link]:
                    overrides.append(f'world.simulated_link="{LINKS[link]}"')
                what = (f"{strategy}, {stages} stages, {micro} micro-batch"
                        + ("es" if micro > 1 else "")
                        + (f", {schedule}" if micro > 1 and strategy == "pipeline" else "")
                        + (f", link {LINKS[link]}" if LINKS[link] else ""))
                todo.append(({"size": size, "what": what, "strategy": strategy,
                              "stages": stages, "micro": micro, "schedule": schedule,
                              "link": LINKS[link]},
                             partial(pipeline, config, overrides, steps, warmup, workdir)))
                if (stages, micro, link) == (2, 4, "none") and size == "wide":
                    # what deferring linear weights' gradients is worth, in the same round
                    todo.append(({"size": size, "what": what + ", weight grads per micro-batch",
                                  "strategy": strategy, "stages": stages, "micro": micro,
                                  "schedule": schedule, "link": None, "deferred": False},
                                 partial(pipeline, config,
                                         overrides + ["pipeline.defer_weight_grads=false"],
                                         steps, warmup, workdir)))
    try:
        import torch  # noqa: F401
    except ImportError:
        torch = None
    if torch is not None and "wide" in plan and "none" in links:
        steps, warmup = plan["wide"]["steps"], plan["wide"]["warmup"]
        todo.append(({"size": "wide", "what": "torch: one process, 1 thread", "torch": True,
                      "threads": 1}, partial(torch_run, "torch-single", 1, steps, warmup, workdir)))
        for micro in (4, 8):
            todo.append(({"size": "wide", "what": f"torch: GPipe over gloo, 2 stages, {micro} "
                          "micro-batches", "torch": True},
                         partial(torch_run, "torch-gpipe", micro, steps, warmup, workdir)))
        todo.append(({"size": "wide", "what": "torch: DDP over gloo, 2 ranks", "torch": True,
                      "replicas": 2},
                     partial(torch_run, "torch-ddp", 1, steps, warmup, workdir)))
    rates = [[] for _ in todo]
    try:
        for _ in range(args.rounds):
            for i, (_, measure) in enumerate(todo):
                rates[i].append(measure())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [dict(row, rate=statistics.median(r), rounds=r) for (row, _), r in zip(todo, rates)]
    for row in rows:
        same = [r for r in rows if r["size"] == row["size"] and r.get("torch") == row.get("torch")]
        one = next(r for r in same if r.get("threads") == 1)["rate"]
        row["vs_one_thread"] = row["rate"] / one
        if not row.get("torch"):
            row["vs_all_cores"] = row["rate"] / next(r for r in same
                                                     if r.get("threads") == cores)["rate"]

    print(f"distgrad launch pipelines and replicas vs one process ({cores} cores; medians of {args.rounds} "
          "rounds; ratios against the same framework's one-process run)")
    print(f"{'size':11s} {'configuration':62s} {'samples/s':>10s} {'x 1 thread':>11s} "
          f"{'x all cores':>12s}")
    for r in rows:
        all_cores = f"{r['vs_all_cores']:12.2f}" if "vs_all_cores" in r else f"{'':12s}"
        print(f"{r['size']:11s} {r['what']:62s} {r['rate']:10.0f} {r['vs_one_thread']:11.2f} "
              f"{all_cores}")
    verdict = _verdict(rows)
    for line in verdict["lines"]:
        print(line)
    print(json.dumps({"bench": "launch", "cores": cores, "rows": rows,
                      "targets": TARGETS, "met": verdict["met"]}))
    return 0


def _verdict(rows):
    def best(size, stages, micro_min=1, micro_max=1, strategy="pipeline"):
        rates = [r for r in rows if r["size"] == size and r.get("stages") == stages
                 and r.get("strategy") == strategy and not r.get("link")
                 and r.get("deferred", True)  # the default configuration's rows
                 and micro_min <= r.get("micro", 0) <= micro_max]
        return max(rates, key=lambda r: r["rate"]) if rates else None
    quick = best("quickstart", 2)
    wide = best("wide", 2, 2, 1024)
    met, lines = {}, []
    for r in rows:  # no target set: reported
        if r.get("replicas") and not r.get("torch"):
            lines.append(f"{r['size']}, ddp with 2 replicas: {r['vs_one_thread']:.2f}x one "
                         f"thread, {r['vs_all_cores']:.2f}x all cores (samples/s)")
    if quick:
        slowdown = 1 / quick["vs_one_thread"]
        met["quickstart"] = slowdown <= TARGETS["quickstart_slowdown_max"]
        lines.append(f"quickstart, 2 stages: {slowdown:.2f}x the one-process time per sample "
                     f"(target <= {TARGETS['quickstart_slowdown_max']}x): "
                     f"{'met' if met['quickstart'] else 'NOT met'}")
    if wide:
        met["wide_one_thread"] = wide["vs_one_thread"] >= TARGETS["wide_vs_one_thread_min"]
        met["wide_all_cores"] = wide["vs_all_cores"] >= TARGETS["wide_vs_all_cores_min"]
        lines.append(f"wide, 2 stages, {wide['micro']} micro-batches: {wide['vs_one_thread']:.2f}x "
                     f"one thread (target >= {TARGETS['wide_vs_one_thread_min']}), "
                     f"{wide['vs_all_cores']:.2f}x all cores (target >= "
                     f"{TARGETS['wide_vs_all_cores_min']}): "
                     f"{'met' if met['wide_one_thread'] and met['wide_all_cores'] else 'NOT met'}")
    # the targets, per strategy

    def check(key, ok, text):
        met[key] = ok
        lines.append(f"{text}: {'met' if ok else 'NOT met'}")
    found = {}
    for strategy in ("pipeline", "autograd"):
        w4 = best("wide", 2, 4, 4, strategy)
        q2 = best("quickstart", 2, 1, 1024, strategy)
        if w4:
            found[strategy] = w4
            target = TARGETS["wide_2_stages_4_micro_min"]
            check(f"wide_2x4_{strategy}", w4["vs_one_thread"] >= target,
                  f"wide, 2 stages, 4 micro-batches, {strategy}: {w4['vs_one_thread']:.2f}x "
                  f"one thread (target >= {target})")
        if q2:
            target = TARGETS["quickstart_2_stages_min"]
            check(f"quickstart_2_{strategy}", q2["vs_one_thread"] >= target,
                  f"quickstart, 2 stages, {strategy} (best: {q2['micro']} micro-batches): "
                  f"{q2['vs_one_thread']:.2f}x one thread (target >= {target})")
    if len(found) == 2:
        ratio, target = found["autograd"]["rate"] / found["pipeline"]["rate"], \
            TARGETS["autograd_vs_pipeline_min"]
        check("autograd_vs_pipeline", ratio >= target,
              f"wide, 2 stages, 4 micro-batches: autograd at {ratio:.2f}x the pipeline "
              f"strategy (target >= {target})")
    return {"met": met, "lines": lines}


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_launch"):  # with --record: its section of docs/performance.md
        sys.exit(main())
