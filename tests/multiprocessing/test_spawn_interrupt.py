"""An interrupt that reaches ``spawn``'s parent just after a child started (before the
parent recorded it) still ends that child at once.

The parent used to record a child after ``Process.start()`` returned: a Ctrl-C in
between left it out of the processes to terminate, and the interpreter's exit then
joined it, a non-daemon child, for as long as it ran (60 s here). Here the window is
widened to 3 s, so the interrupt always lands in it.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(90)

HERE = os.path.dirname(os.path.abspath(__file__))

PARENT = '''
import signal
import sys
import time
from multiprocessing.process import BaseProcess

import distgrad.multiprocessing as mp
import spawn_targets


def start_then_linger(self, started=BaseProcess.start):
    started(self)
    open(sys.argv[2], "w").close()   # the test interrupts us now
    time.sleep(3)


if __name__ == "__main__":  # (the child imports this file too)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # see spawn_targets.parent_main
    BaseProcess.start = start_then_linger
    mp.spawn(spawn_targets.sleep_forever, args=(sys.argv[1],), nprocs=1)
'''


def test_an_interrupt_right_after_a_child_started_ends_it(tmp_path):
    (tmp_path / "parent.py").write_text(PARENT)
    children, lingering = tmp_path / "children", tmp_path / "lingering"
    children.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, *sys.path]))
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(children),
                               str(lingering)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (lingering.exists() and os.listdir(children)):
            assert parent.poll() is None and time.monotonic() < deadline, "no child started"
            time.sleep(0.02)
        time.sleep(0.1)  # the child's pid is written whole
        child = int((children / "pid-0").read_text())
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=20)   # 60 s when the child is not ended
        assert b"KeyboardInterrupt" in err, err
        with pytest.raises(ProcessLookupError):    # reaped by the parent, not left to init
            os.kill(child, 0)
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
