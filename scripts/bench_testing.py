"""Local multi-process tests: how fast a world starts, and what an SPMD test costs.

    python scripts/bench_testing.py [--reps 7] [--tests 20] [--torch-tests 2]

1. Start to first call: ``World(n).start()`` until every worker has answered one call,
   for n = 1, 2 and 4 workers; workers forked by the fork server (the default) and
   spawned as ``python -m distgrad worker`` (the floor without the server). Medians of
   ``--reps`` worlds; the fork server's own start, paid once per test process, apart.
2. Per-test time of a trivial SPMD test with 2 ranks (``@pytest.mark.world(2)``: a
   world, the test on both ranks, the leak check, the close) and of a plain test, each
   file in its own pytest run: the median over the tests of setup + call + teardown.
3. PyTorch's ``MultiProcessTestCase`` with 2 ranks and a trivial test, the same measure
   (when torch is installed; its test utilities also need the ``expecttest`` package).

Prints a table and one JSON line. Targets: an SPMD test with 2 ranks costs at most
0.5 s more than a plain one, and at most a tenth of PyTorch's.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TORCH_TEST = '''
from torch.testing._internal.common_distributed import MultiProcessTestCase


class Trivial(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()
{tests}
'''


def start_to_first_call(n, start_method, reps):
    import operator
    from distgrad.rpc import api
    from distgrad.testing.world import World
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        world = World(n, start_method=start_method).start()
        try:
            for name in world.names[1:]:
                api.rpc_sync(name, operator.add, (1, 1))
            times.append(time.perf_counter() - t0)
        finally:
            world.close()
    return statistics.median(times)


def fork_server_start():
    from distgrad.testing import forkserver
    from distgrad.testing.world import _ROOT
    forkserver.stop_server()
    t0 = time.perf_counter()
    forkserver.fork_server([_ROOT, *sys.path]).wait_ready()
    return time.perf_counter() - t0


def per_test(folder, name, source, *pytest_args):
    """(median seconds of setup+call+teardown per test, wall seconds of the run)."""
    path = folder / name
    path.write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--durations=0", "--durations-min=0",
                           *pytest_args, name], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    per = {}
    for m in re.finditer(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+)$", proc.stdout, re.M):
        per[m.group(2)] = per.get(m.group(2), 0.0) + float(m.group(1))
    return statistics.median(per.values()), wall


def torch_available():
    import importlib.util
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "expecttest"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7, help="worlds per start-up figure")
    ap.add_argument("--tests", type=int, default=20, help="tests per pytest run")
    ap.add_argument("--torch-tests", type=int, default=2, help="MultiProcessTestCase tests")
    args = ap.parse_args()

    out = {"fork_server_start_s": fork_server_start(), "start_to_first_call_s": {},
           "spawn_start_to_first_call_s": {}}
    for n in (1, 2, 4):
        out["start_to_first_call_s"][str(n)] = start_to_first_call(n, "fork", args.reps)
        out["spawn_start_to_first_call_s"][str(n)] = start_to_first_call(
            n, "spawn", max(3, args.reps // 2))

    spmd = "import pytest\n" + "".join(
        f"\n@pytest.mark.world(2)\ndef test_{i}(rank, world_size):\n    assert world_size == 2\n"
        for i in range(args.tests))
    plain = "".join(f"\ndef test_{i}():\n    assert 2 == 2\n" for i in range(args.tests))
    with tempfile.TemporaryDirectory(prefix="bench-testing-") as d:
        folder = Path(d)
        out["plain_test_s"], plain_wall = per_test(folder, "test_plain.py", plain)
        out["spmd_test_s"], spmd_wall = per_test(folder, "test_spmd.py", spmd)
        out["spmd_run_wall_per_test_s"] = (spmd_wall - plain_wall) / args.tests
        out["torch_mptc_test_s"] = None
        if torch_available():
            tests = "".join(f"\n    def test_{i}(self):\n        assert self.rank in (0, 1)\n"
                            for i in range(args.torch_tests))
            out["torch_mptc_test_s"], _ = per_test(folder, "test_torch_mptc.py",
                                                   TORCH_TEST.format(tests=tests),
                                                   "-p", "no:distgrad")
    overhead = out["spmd_test_s"] - out["plain_test_s"]
    out["spmd_overhead_s"] = overhead
    torch_s = out["torch_mptc_test_s"]
    out["spmd_vs_torch"] = overhead / torch_s if torch_s else None
    out["meets_0_5_s"] = overhead <= 0.5
    out["meets_tenth_of_torch"] = (overhead <= torch_s / 10) if torch_s else None

    rows = [("fork server start (once per test process)", out["fork_server_start_s"], "")]
    for n in ("1", "2", "4"):
        rows.append((f"world of {n} worker(s): start to first call, forked",
                     out["start_to_first_call_s"][n],
                     f"spawned: {out['spawn_start_to_first_call_s'][n]:.3f} s"))
    rows += [("plain test (setup+call+teardown)", out["plain_test_s"], ""),
             ("SPMD test, 2 ranks (setup+call+teardown)", out["spmd_test_s"],
              f"overhead {overhead:.3f} s (target <= 0.5 s)"),
             ("SPMD run, wall time per test minus plain", out["spmd_run_wall_per_test_s"], "")]
    if torch_s:
        rows.append(("torch MultiProcessTestCase, 2 ranks, per test", torch_s,
                     f"SPMD overhead = {out['spmd_vs_torch']:.3f} of it (target <= 0.1)"))
    else:
        rows.append(("torch MultiProcessTestCase", float("nan"),
                     "not measured: torch or expecttest missing"))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'seconds':>8}  note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:8.3f}  {note}")
    print(json.dumps(out))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_testing"):  # with --record: its section of docs/performance.md
        main()
