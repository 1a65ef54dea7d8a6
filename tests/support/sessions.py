"""Running a program in a session of its own, for tests that start process trees."""
import os
import signal
import subprocess


def run_in_session(argv, env, cwd, timeout=150):
    """``(exit status, stdout, stderr)`` of ``argv``; the whole session (the program and
    whatever it started) is killed at the end, pass or fail."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return proc.returncode, out, err
