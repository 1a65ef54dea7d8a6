"""distgrad.multiprocessing.spawn: torch's signatures, errors and reaping, with real children."""
import inspect
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

import pytest

import distgrad.multiprocessing as mp
from distgrad.utils.tempdirs import pid_alive

sys.path.insert(0, os.path.dirname(__file__))  # the children import spawn_targets by name
import spawn_targets  # noqa: E402

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pids():
    """Pids the test learns of; any still alive at teardown is killed, pass or fail."""
    known = []
    yield known
    for pid in known:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_pids(path, count, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = [n for n in os.listdir(path) if n.startswith("pid-") and not n.endswith(".tmp")]
        if len(names) == count:
            time.sleep(0.05)  # let the last writer finish
            return {int(n[4:]): int(open(os.path.join(path, n)).read()) for n in names}
        time.sleep(0.05)
    raise AssertionError(f"children did not start within {timeout} s: {os.listdir(path)}")


def _running(pid):
    """Alive and not a zombie: an orphan killed with its parent is reaped by init,
    whenever init gets to it (slowly on a loaded machine), not by us."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:  # gone meanwhile, or no /proc
        return pid_alive(pid)


def _wait_gone(pid_list, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(p) for p in pid_list):
        time.sleep(0.05)
    return [p for p in pid_list if _running(p)]


def _our_error_dirs():
    prefix = f"distgrad-spawn-{os.getpid()}-"
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix)]


def test_api_matches_torch():
    torch_mp = pytest.importorskip("torch.multiprocessing")
    for name in ("spawn", "start_processes"):
        assert (inspect.signature(getattr(mp, name))
                == inspect.signature(getattr(torch_mp, name)))
    import importlib
    ours_mod = importlib.import_module("distgrad.multiprocessing.spawn")
    theirs_mod = importlib.import_module("torch.multiprocessing.spawn")
    for name in ("ProcessRaisedException", "ProcessExitedException", "ProcessException"):
        ours, theirs = getattr(ours_mod, name), getattr(theirs_mod, name)
        assert (list(inspect.signature(ours).parameters)
                == list(inspect.signature(theirs).parameters))
    assert issubclass(mp.ProcessRaisedException, ours_mod.ProcessException)
    assert set(torch_mp.__all__) <= set(mp.__all__)
    assert mp.Process is torch_mp.Process and mp.get_context is torch_mp.get_context
    assert list(inspect.signature(mp.ProcessContext.join).parameters) == \
        list(inspect.signature(torch_mp.ProcessContext.join).parameters)


def test_spawn_runs_fn_with_index_and_args_and_context_joins(tmp_path, pids):
    context = mp.spawn(spawn_targets.write_rank, args=(str(tmp_path),), nprocs=2, join=False)
    pids.extend(context.pids())
    assert isinstance(context, mp.ProcessContext) and len(context.processes) == 2
    deadline = time.monotonic() + 60
    while not context.join(timeout=0.5):
        assert time.monotonic() < deadline
    assert context.join() is True  # again, when done
    written = {n: int((tmp_path / n).read_text()) for n in os.listdir(tmp_path)}
    assert written == {"rank-0": context.pids()[0], "rank-1": context.pids()[1]}
    assert _our_error_dirs() == []


def test_child_exception_raises_with_traceback_and_reaps_the_others(tmp_path, pids):
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(spawn_targets.fail_on, args=(1, str(tmp_path), 2), nprocs=2)
    children = _read_pids(str(tmp_path), 2, timeout=1)  # process 1 waited for them
    pids.extend(children.values())
    e = info.value
    assert e.error_index == 1 and e.error_pid == children[1]
    assert str(e).startswith("\n\n-- Process 1 terminated with the following error:\n"
                             "Traceback (most recent call last):\n")
    assert "in fail_on" in str(e) and str(e).rstrip().endswith(
        "ValueError: process 1 failed on purpose")
    assert e.msg == str(e)
    assert [p for p in children.values() if pid_alive(p)] == []  # reaped, not just signalled
    assert _our_error_dirs() == []


@pytest.mark.parametrize("target, args, message, code, signal_name", [
    (spawn_targets.exit_with, (3,), "process 0 terminated with exit code 3", 3, None),
    (spawn_targets.kill_self, (), "process 0 terminated with signal SIGKILL", -9, "SIGKILL"),
])
def test_child_exit_raises_process_exited(target, args, message, code, signal_name):
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(target, args=args, nprocs=1)
    e = info.value
    assert (str(e), e.exit_code, e.signal_name, e.error_index) == (message, code, signal_name, 0)
    assert not pid_alive(e.error_pid)


def test_non_spawn_start_method_warns_as_torch():
    with pytest.warns(FutureWarning, match="only supports start_method=spawn"):
        assert mp.spawn(spawn_targets.write_rank, args=("unused",), nprocs=0,
                        start_method="fork") is None


def test_unpicklable_fn_fails_in_the_parent_and_leaves_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception, match="pickle|Can't"):
            mp.spawn(lambda i: None, nprocs=2)
    assert _our_error_dirs() == []


def _parent(tmp_path, nprocs):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, spawn_targets.__file__, str(tmp_path), str(nprocs)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_children_die_when_the_parent_is_killed(tmp_path, pids):
    parent = _parent(tmp_path, 1)
    try:
        children = list(_read_pids(str(tmp_path), 1).values())
        pids.extend(children)
        parent.kill()
        parent.wait(10)
        assert _wait_gone(children) == []
    finally:
        parent.kill()
        parent.wait(10)


def test_interrupted_parent_terminates_its_children(tmp_path, pids):
    parent = _parent(tmp_path, 1)
    try:
        children = list(_read_pids(str(tmp_path), 1).values())
        pids.extend(children)
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=30)
        assert b"KeyboardInterrupt" in err
        assert _wait_gone(children, timeout=1) == []
    finally:
        parent.kill()
        parent.wait(10)
