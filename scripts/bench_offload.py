"""Activation offloading: peak memory and step time of one training step, against PyTorch.

    python scripts/bench_offload.py                 # B2048-D1024-L16 tanh MLP, float32
    python scripts/bench_offload.py --batch 256 --width 256 --layers 4 --steps 2   # quick

Every variant runs in a fresh process of its own: distgrad without offloading
(the floor), with ``save_on_disk`` (plain reads, memory maps, and without
read-ahead), with a ``distgrad store`` process on this machine (ipc), with
``save_tiered`` (16 MiB in memory, then disk), and PyTorch without offloading
and with the synchronous disk hooks of PyTorch's autograd note ("Saving tensors
to disk": ``torch.save`` in pack, ``torch.load`` in unpack, one file per tensor
of at least 1000 elements). The processes run their steps in turns (one round =
one step of each variant, :mod:`distgrad.offload.harness`), so a machine that
gets busier slows all variants alike.

What is measured, identically for all: after one warm-up step (it allocates the
``.grad`` buffers; later steps accumulate into them, zeroed in place), the peak
RSS of the whole process during a step (forward + backward) above its RSS just
before the step (the kernel's VmHWM, reset per step), and the step's wall time;
medians over ``--steps`` rounds (the slowdown is the median of the per-round
ratios: steps of one round run moments apart). The children run NumPy/PyTorch on one thread
(``*_NUM_THREADS=1``, ``torch.set_num_threads(1)``), leaving the other core to
I/O threads, and with ``MALLOC_MMAP_THRESHOLD_=65536`` so that a freed activation
returns its pages to the OS at once and RSS tracks live memory (glibc would
otherwise keep freed 8 MiB blocks in its heap and no variant's RSS would fall).
Targets (issue 11): disk at most 30% of the floor's peak memory and 1.15x its
time; the store at most 30% and 1.3x; both better than PyTorch's disk hooks on
both ratios. Prints a table and one JSON line.
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distgrad.offload.harness import (Lockstep, serve_steps, serve_training,  # noqa: E402
                                      slowdown)

VARIANTS = {
    "distgrad": ("distgrad", None),
    "distgrad-disk": ("distgrad", {"kind": "disk", "read": "read"}),
    "distgrad-disk-mmap": ("distgrad", {"kind": "disk", "read": "mmap"}),
    "distgrad-disk-sync": ("distgrad", {"kind": "disk", "prefetch_bytes": 0}),
    "distgrad-store": ("distgrad", {"kind": "remote"}),
    "distgrad-tiered": ("distgrad", {"kind": "tiered", "memory_bytes": 16 << 20}),
    "torch": ("torch", None),
    "torch-disk-hooks": ("torch", "note"),
}


# ---------------------------------------------------------------- children
def child_distgrad(args, spec, store):
    import distgrad
    from distgrad import nn
    from distgrad.offload import hooks_from_config
    distgrad.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(args.layers)
                            for m in (nn.Linear(args.width, args.width), nn.Tanh())])
    x = distgrad.randn(args.batch, args.width)
    if spec:
        spec = dict(spec, policy={"min_bytes": 1 << 16})
        if args.prefetch_bytes is not None and "prefetch_bytes" not in spec:
            spec["prefetch_bytes"] = args.prefetch_bytes
        if args.inflight_bytes is not None:
            spec["max_inflight_bytes"] = args.inflight_bytes
    hooks = hooks_from_config(spec, "bench", store=store) if spec else None
    serve_training(model, x, hooks)


def child_torch(args, spec):
    import contextlib
    import shutil
    import uuid
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(args.layers)
                                  for m in (torch.nn.Linear(args.width, args.width),
                                            torch.nn.Tanh())])
    x = torch.randn(args.batch, args.width)
    tmp_dir = tempfile.mkdtemp(prefix="bench-offload-torch-")

    # PyTorch's autograd note, "Saving tensors to disk", as written there
    class SelfDeletingTempFile:
        def __init__(self):
            self.name = os.path.join(tmp_dir, str(uuid.uuid4()))

        def __del__(self):
            os.remove(self.name)

    SAVE_ON_DISK_THRESHOLD = 1000

    def pack_hook(tensor):
        if tensor.numel() < SAVE_ON_DISK_THRESHOLD:
            return tensor.detach()
        temp_file = SelfDeletingTempFile()
        torch.save(tensor, temp_file.name)
        return temp_file

    def unpack_hook(tensor_or_sctf):
        if isinstance(tensor_or_sctf, torch.Tensor):
            return tensor_or_sctf
        return torch.load(tensor_or_sctf.name)

    def step():
        ctx = torch.autograd.graph.saved_tensors_hooks(pack_hook, unpack_hook) if spec \
            else contextlib.nullcontext()
        with ctx:
            loss = model(x).pow(2).mean()
        loss.backward()

    def zero_grads():
        model.zero_grad(set_to_none=False)
    try:
        serve_steps(step, zero_grads)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


# ---------------------------------------------------------------- parent
def read_costs(nbytes, repeats=21):
    """Median seconds to read and verify one record of ``nbytes`` and touch its bytes, per
    read mode, alternating the modes (the file is in the page cache, as right after
    forward wrote it)."""
    import numpy as np
    from distgrad.offload.disk import READ_MODES, DiskTier
    tiers = {mode: DiskTier(read=mode) for mode in READ_MODES}
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    for tier in tiers.values():
        tier.put(0, data)
        tier.flush()
    times = {mode: [] for mode in READ_MODES}
    for _ in range(repeats):
        for mode, tier in tiers.items():
            t0 = time.perf_counter()
            tier.get(0).view(np.int64).sum()   # touch it, as backward will
            times[mode].append(time.perf_counter() - t0)
    for tier in tiers.values():
        tier.close()
    return {mode: sorted(t)[len(t) // 2] for mode, t in times.items()}


def child_argv(name, args, store):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--batch", str(args.batch),
           "--width", str(args.width), "--layers", str(args.layers)]
    if store:
        cmd += ["--store", store]
    for flag, value in (("--prefetch-bytes", args.prefetch_bytes),
                        ("--inflight-bytes", args.inflight_bytes)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def _mib(n):
    return f"{n / (1 << 20):.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5,
                    help="measured rounds; each runs one step of every variant in turn")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of: " + ", ".join(VARIANTS))
    ap.add_argument("--prefetch-bytes", type=int, default=None,
                    help="read-ahead window of the distgrad variants (default: the library's)")
    ap.add_argument("--inflight-bytes", type=int, default=None,
                    help="bytes in flight before forward waits (default: the library's)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        lib, spec = VARIANTS[args.child]
        if lib == "torch":
            child_torch(args, spec)
        else:
            child_distgrad(args, spec, args.store)
        return 0

    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("note: torch is not installed; the PyTorch variants are skipped")
        names = [n for n in names if VARIANTS[n][0] != "torch"]
    from distgrad.offload.store.command import spawn_store
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-offload-") as tmp:
        with spawn_store("--bind", f"ipc://{tmp}/store.sock", "--memory-bytes", "4G") \
                as (endpoint, _):
            argvs = {n: child_argv(n, args, endpoint if "store" in n else None) for n in names}
            with Lockstep(argvs, env=env) as lockstep:
                for i in range(args.steps):
                    lockstep.round()
                    print(f"  round {i + 1} of {args.steps} done after "
                          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
                results = lockstep.summary()
                for name, final in lockstep.finish().items():
                    results[name]["stats"] = final.get("stats")

    def ratio(name, what):
        base = "torch" if name.startswith("torch") else "distgrad"
        r, b = results.get(name, {}), results.get(base, {})
        if what not in r or what not in b or not b[what]:
            return None
        return slowdown(r, b) if what == "step_s" else r[what] / b[what]

    shape = f"B{args.batch}-D{args.width}-L{args.layers}"
    print(f"\nActivation offloading, {shape} tanh MLP, float32, one forward+backward step "
          f"(medians of {args.steps} rounds; slowdown = median of per-round ratios; "
          "peak = process peak RSS above its RSS before the step)")
    head = (f"{'variant':<20}{'step s':>8}{'slowdown':>10}{'peak MiB':>10}{'mem ratio':>10}"
            f"{'offl MiB':>10}{'dedup MiB':>10}{'hit/miss':>10}{'fwd wait':>9}{'bwd wait':>9}")
    print(head)
    print("-" * len(head))
    for name in names:
        r = results[name]
        if "error" in r:
            print(f"{name:<20} failed: {r['error']}")
            continue
        s = r.get("stats")
        sr, mr = ratio(name, "step_s"), ratio(name, "peak_bytes")
        print(f"{name:<20}{r['step_s']:>8.2f}{sr:>9.2f}x{_mib(r['peak_bytes']):>10}{mr:>9.0%} "
              + (f"{_mib(s['bytes_offloaded']):>9}{_mib(s['bytes_deduplicated']):>10}"
                 f"{s['prefetch_hits']:>5.0f}/{s['prefetch_misses']:<4.0f}"
                 f"{s['forward_wait_s']:>9.3f}{s['backward_wait_s']:>9.3f}" if s else
                 f"{'-':>9}{'-':>10}{'-':>10}{'-':>9}{'-':>9}"))

    targets = {}

    def target(name, mem, slow):
        sr, mr = ratio(name, "step_s"), ratio(name, "peak_bytes")
        t_sr, t_mr = ratio("torch-disk-hooks", "step_s"), ratio("torch-disk-hooks", "peak_bytes")
        ok = sr is not None and mr is not None and mr <= mem and sr <= slow
        beats = None if t_sr is None or sr is None else (sr < t_sr and mr < t_mr)
        targets[name] = {"memory_ratio": mr, "slowdown": sr, "memory_target": mem,
                         "slowdown_target": slow, "meets": ok, "beats_torch_disk_hooks": beats}
        if sr is not None and mr is not None:
            vs = "" if beats is None else \
                (f"; vs PyTorch disk hooks ({t_mr:.0%}, {t_sr:.2f}x): "
                 f"{'better on both' if beats else 'NOT better on both'}")
            print(f"{name}: memory {mr:.0%} (target <= {mem:.0%}), time {sr:.2f}x "
                  f"(target <= {slow:.2f}x): {'met' if ok else 'NOT met'}{vs}")
    print()
    for name, mem, slow in (("distgrad-disk", 0.30, 1.15), ("distgrad-disk-mmap", 0.30, 1.15),
                            ("distgrad-store", 0.30, 1.30)):
        if name in results:
            target(name, mem, slow)
    record = args.batch * args.width * 4
    costs = read_costs(record)
    print(f"read and verify one {record / (1 << 20):.0f} MiB record from the page cache: "
          + ", ".join(f"{mode} {t * 1e3:.2f} ms" for mode, t in costs.items()))
    print(json.dumps({"bench": "offload", "shape": shape, "steps": args.steps,
                      "results": results, "targets": targets, "read_costs_s": costs}))
    return 0


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_offload"):  # with --record: its section of docs/performance.md
        sys.exit(main())
