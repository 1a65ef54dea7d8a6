"""PyTorch's own distributed autograd tests, bodies unchanged, on PyTorch and on distgrad.

The tests are the installed torch's
``torch/testing/_internal/distributed/rpc/dist_autograd_test.py``, loaded from there as
the ranks run them (``torch_dist_autograd/torch_cases.py``), with its imports of PyTorch's
test internals naming ``pytorch_fixture.py`` instead; where PyTorch is absent they skip,
and ``test_dist_autograd_semantics.py`` checks in our own words the behaviours they
check. Of the 102 test methods of torch 2.13.0's file
the 54 in :data:`TESTS` use only public API; the others need CUDA (6), TorchScript
(3), the profiler (1), the faulty RPC agent (2), or private introspection of
autograd contexts (``_current_context``, ``_retrieve_context``, ``_get_debug_info``,
``_new_context``, ``_get_max_id``: 35) or of the process group's store (1).

Each test runs as PyTorch runs it: on every rank of a 4-process world (``runner.py``),
where its ``dist_init`` joins a fresh RPC world and leaves it. On PyTorch every test
gets new processes, forked from a Python that imported torch once
(``integration/torch_zygote.py``), as in PyTorch's own suite: PyTorch keeps RRef state
across ``rpc.shutdown()``, and a second RPC world in one process hangs in its shutdown.
On distgrad the ranks run under ``python -m distgrad.compat.as_torch`` and a world
serves test after test (its test module reloaded in between, so its globals start
fresh), until a test fails or does not shut down cleanly; then a new world starts.
Every case runs on distgrad in every run; on PyTorch, four do (:data:`ON_TORCH_ALWAYS`)
and the rest with ``-m slow``.
"""
import importlib.metadata
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from integration.torch_zygote import Zygote

HERE = Path(__file__).resolve().parent / "torch_dist_autograd"
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))
import torch_cases  # noqa: E402

TORCH_FILE = torch_cases.torch_test_file()
TORCH_VERSION = "2.13.0"  # the torch whose test file TESTS names
WORLD_SIZE = 4
START_TIMEOUT = 60     # seconds for a world's ranks to start and connect
TEST_TIMEOUT = 90      # seconds for one test on every rank
GRACE = 5              # seconds the other ranks get to finish after one failed

pytestmark = pytest.mark.timeout(TEST_TIMEOUT + START_TIMEOUT + 30)

_DIST = "DistAutogradTest."
_SPARSE = "TensorPipeAgentDistAutogradTest."
TESTS = [_DIST + name for name in (
    "test_nested_context", "test_grad_only_on_return_value",
    "test_grad_only_on_return_value_remote", "test_error_in_context",
    "test_backward_no_grad_on_tensor", "test_backward_simple", "test_backward_simple_self",
    "test_backward_rref", "test_backward_rref_multi", "test_backward_rref_nested",
    "test_trainer_ps", "test_backward_multiple_round_trips", "test_backward_different_tensor_dims",
    "test_backward_unused_tensors", "test_backward_multiple_output_tensors",
    "test_backward_unused_send_function", "test_backward_autograd_engine_error",
    "test_backward_node_failure", "test_backward_without_context", "test_backward_without_rpc",
    "test_backward_invalid_args", "test_backward_multiple_roots", "test_backward_different_dtypes",
    "test_backward_simple_python_udf", "test_backward_complex_python_udf",
    "test_backward_python_udf_error", "test_backwards_nested_python_udf",
    "test_mixed_requires_grad", "test_async_dist_autograd", "test_backward_accumulate_grads",
    "test_nested_backward_accumulate_grads", "test_multiple_backward",
    "test_multiple_backward_with_errors", "test_backward_verify_hooks", "test_no_grad_copy",
    "test_no_grad_copy_sparse", "test_grad_copy_sparse_indices_extra_ref", "test_post_hooks",
    "test_thread_local_context_id")] + [_SPARSE + name for name in (
    "test_backward_no_grad_on_tensor_sparse", "test_backward_simple_sparse",
    "test_backward_simple_self_sparse", "test_backward_rref_multi_sparse",
    "test_backward_rref_sparse", "test_backward_rref_nested_sparse", "test_trainer_ps_sparse",
    "test_backward_multiple_round_trips_sparse", "test_backward_different_dtypes_sparse",
    "test_backward_simple_python_udf_sparse", "test_nested_backward_accumulate_grads_sparse",
    "test_backwards_nested_python_udf_sparse", "test_mixed_requires_grad_sparse",
    "test_multiple_backward_sparse", "test_embedding_bag_with_no_grad_tensors")]

_CLASSMETHOD = ("rpc/allowlist.py: a classmethod passed as the RPC function resolves to its "
                "plain function and is called without its class (\"missing 1 required "
                "positional argument\")")


class _Probe:
    @classmethod
    def method(cls):
        return cls


def _class_methods_resolve_unbound():
    """Whether the allowlist still hands out a class method without its class (the cause
    of the _CLASSMETHOD failures; dropin-procs' allowlist work binds it)."""
    from distgrad.rpc.allowlist import Allowlist
    try:
        return Allowlist([__name__]).resolve(f"{__name__}:_Probe.method")() is not _Probe
    except TypeError:  # called without its class
        return True

#: Tests that fail on distgrad for a cause outside this harness: {test: the cause}. They
#: must fail (strict): when one passes, its entry goes.
XFAIL_ON_DISTGRAD = {
    _DIST + "test_backward_unused_send_function":
        "by design: distgrad's distributed backward finishes once every gradient that can "
        "still arrive has (DESIGN.md, known pitfalls), where PyTorch's FAST mode waits for "
        "the gradient of an unused RPC result forever; the test asserts that hang",
}
if _class_methods_resolve_unbound():
    XFAIL_ON_DISTGRAD.update(dict.fromkeys(
        [_DIST + "test_mixed_requires_grad", _SPARSE + "test_mixed_requires_grad_sparse",
         _SPARSE + "test_embedding_bag_with_no_grad_tensors"], _CLASSMETHOD))

#: Tests that leave a thread blocked for good (PyTorch's FAST-mode backward waits forever
#: for a gradient that never comes): their world is not reused.
SPENDS_WORLD = {_DIST + "test_backward_unused_send_function"}


def _environment():
    env = dict(os.environ)
    env.pop("DISTGRAD_AS_TORCH", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


class World:
    """``WORLD_SIZE`` runner processes connected to this process, each in a session of its
    own; :meth:`close` kills the sessions and reaps them, whatever happened."""

    def __init__(self, backend, workdir, zygote):
        self.backend, self.workdir, self.zygote = backend, workdir, zygote
        workdir.mkdir(parents=True)
        self.pids, self.procs, self.conns, self.buffers = [], [], {}, {}
        self.tests = 0
        listener = socket.socket()
        try:
            listener.bind(("127.0.0.1", 0))
            listener.listen(WORLD_SIZE)
            port = listener.getsockname()[1]
            for rank in range(WORLD_SIZE):
                self._start(rank, port)
            listener.settimeout(START_TIMEOUT)
            for _ in range(WORLD_SIZE):
                conn, _ = listener.accept()
                conn.setblocking(False)
                self.buffers[conn] = b""
                hello = self._read_lines({conn: None}, time.monotonic() + START_TIMEOUT)
                self.conns[hello[conn]["rank"]] = conn
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def _start(self, rank, port):
        argv = [str(HERE / "runner.py"), str(rank), str(port)]
        out, err = self.workdir / f"rank{rank}.out", self.workdir / f"rank{rank}.err"
        if self.zygote is not None:
            self.pids.append(self.zygote.run(json.dumps({
                "argv": argv, "cwd": str(self.workdir), "env": _environment(),
                "stdout": str(out), "stderr": str(err)})))
            return
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen([sys.executable, "-m", "distgrad.compat.as_torch"] + argv,
                                    cwd=self.workdir, stdout=o, stderr=e,
                                    stdin=subprocess.DEVNULL, env=_environment(),
                                    start_new_session=True)
        self.procs.append(proc)
        self.pids.append(proc.pid)

    def _read_lines(self, wanted, deadline):
        """One JSON line from each connection of ``wanted``; stops early when a rank failed
        (then the others get :data:`GRACE` seconds) or a connection closed."""
        got = {}
        sel = selectors.DefaultSelector()
        for conn in wanted:
            sel.register(conn, selectors.EVENT_READ)
        try:
            while len(got) < len(wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(left):
                    conn = key.fileobj
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        sel.unregister(conn)
                        got[conn] = {"outcome": "failed", "detail": "the rank exited"}
                        continue
                    self.buffers[conn] += chunk
                    if b"\n" in self.buffers[conn]:
                        line, self.buffers[conn] = self.buffers[conn].split(b"\n", 1)
                        got[conn] = json.loads(line)
                        sel.unregister(conn)
                        if got[conn].get("outcome") == "failed":
                            deadline = min(deadline, time.monotonic() + GRACE)
        finally:
            sel.close()
        return got

    def run(self, test, file_name):
        """{rank: answer} of ``test`` on every rank (``None``: no answer in time)."""
        self.tests += 1
        command = json.dumps({"test": test, "file_name": file_name}).encode() + b"\n"
        for conn in self.conns.values():
            conn.setblocking(True)
            conn.sendall(command)
            conn.setblocking(False)
        got = self._read_lines(dict.fromkeys(self.conns.values()),
                               time.monotonic() + TEST_TIMEOUT)
        answers = {rank: got.get(conn) for rank, conn in self.conns.items()}
        silent = [self.pids[rank] for rank, a in answers.items() if a is None]
        for pid in silent:  # their stacks, into their stderr (see runner.py)
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if silent:
            time.sleep(1)  # faulthandler writes at once; give the ranks a moment to run it
        return answers

    def output(self):
        parts = []
        for rank in range(len(self.pids)):
            for kind in ("out", "err"):
                path = self.workdir / f"rank{rank}.{kind}"
                text = path.read_text(errors="replace").strip() if path.exists() else ""
                if text:
                    parts.append(f"--- rank {rank} std{kind}\n" +
                                 "\n".join(text.splitlines()[-30:]))
        return "\n".join(parts)

    def close(self):
        for conn in self.conns.values():
            conn.close()
        for pid in self.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            proc.wait(timeout=30)
        if self.zygote is not None:
            for pid in self.pids:
                try:
                    self.zygote.wait(pid, 30)
                except (subprocess.TimeoutExpired, RuntimeError):
                    pass


class Worlds:
    """The current world of each backend, started on first use and again after one was
    spent; each test gets a fresh init file."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.current = {}
        self.started = 0
        self.zygote = None

    def run(self, backend, test):
        world = self.current.get(backend)
        if world is None:
            if backend == "torch" and self.zygote is None:
                self.zygote = Zygote(_environment())
            self.started += 1
            world = World(backend, self.workdir / f"world{self.started}-{backend}",
                          self.zygote if backend == "torch" else None)
            self.current[backend] = world
        answers = world.run(test, str(world.workdir / f"init{world.tests}"))
        spent = backend == "torch" or test in SPENDS_WORLD or \
            any(a is None or a.get("spent") for a in answers.values())
        if spent:
            del self.current[backend]
            world.close()
        return answers, world

    def close(self):
        for world in self.current.values():
            world.close()
        if self.zygote is not None:
            self.zygote.close()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    w = Worlds(tmp_path_factory.mktemp("dist_autograd"))
    yield w
    w.close()


# Every case runs on distgrad. On PyTorch, what a case's passing there shows (that the
# harness loads PyTorch's file and runs it as PyTorch does) a few cases show in every run;
# the whole set on PyTorch runs with ``-m slow`` (it tests PyTorch, not us: ~70 s).
ON_TORCH_ALWAYS = {_DIST + "test_backward_simple", _DIST + "test_backward_rref_nested",
                   _DIST + "test_trainer_ps", _SPARSE + "test_backward_simple_sparse"}


def _cases(backend):
    for test in TESTS:
        marks = []
        if backend == "distgrad" and test in XFAIL_ON_DISTGRAD:
            marks.append(pytest.mark.xfail(strict=True, reason=XFAIL_ON_DISTGRAD[test]))
        if backend == "torch" and test not in ON_TORCH_ALWAYS:
            marks.append(pytest.mark.slow)
        yield pytest.param(backend, test, marks=marks, id=f"{backend}-{test.split('.')[1]}")


@pytest.mark.parametrize("backend,test", [*_cases("distgrad"), *_cases("torch")])
def test_pytorch_dist_autograd_test(backend, test, worlds):
    if TORCH_FILE is None:
        pytest.skip("the cases are the installed torch's, and no torch is installed")
    if not importlib.metadata.version("torch").startswith(TORCH_VERSION):
        pytest.skip(f"TESTS names the cases of torch {TORCH_VERSION}")
    answers, world = worlds.run(backend, test)
    outcomes = {rank: (a or {}).get("outcome") for rank, a in answers.items()}
    if all(o == "skipped" for o in outcomes.values()):
        pytest.skip(answers[0]["detail"])
    if all(o == "passed" for o in outcomes.values()):
        return
    report = []
    for rank, a in sorted(answers.items()):
        if a is None:
            report.append(f"=== rank {rank}: no answer within {TEST_TIMEOUT} s")
        elif a["outcome"] != "passed":
            report.append(f"=== rank {rank} {a['outcome']}:\n{a['detail']}")
    pytest.fail(f"{test} on {backend}:\n" + "\n".join(report) + "\n" + world.output(),
                pytrace=False)


def test_only_the_imports_of_pytorchs_test_internals_change():
    """What runs is PyTorch's file: the loader changes the lines that import
    ``torch.testing._internal``, to name the fixture, and nothing else."""
    if TORCH_FILE is None:
        pytest.skip("no torch (with its test internals) is installed")
    theirs = TORCH_FILE.read_text().splitlines()
    ours = torch_cases.source(TORCH_FILE.read_text()).splitlines()
    assert len(ours) == len(theirs)
    changed = [(a, b) for a, b in zip(theirs, ours) if a != b]
    assert changed and all("torch.testing._internal" in a and torch_cases.FIXTURE in b
                           for a, b in changed), changed
