"""A Python that has imported the real torch once and forks a child per reference run.

``import torch`` costs seconds of CPU, several times more than running one of the
example programs; a child forked from a process that already imported it starts at
once. Each child runs its program as ``python program.py ARGS`` would: a session of
its own, the program's folder first on ``sys.path``, ``sys.argv``, ``__main__``,
the given environment, working directory and output files. Processes the program
starts (``torch.multiprocessing.spawn``) are fresh interpreters as usual.

The zygote forks only from its single thread (no thread is running when it forks)
and reaps its children itself, reporting each exit status on its stdout.
"""
import os
import signal
import subprocess
import sys
import threading

_SERVER = r'''
import json, os, runpy, select, sys, traceback
import torch  # noqa: F401 - the point: every forked run inherits it

def run(req):
    os.setsid()
    for fd, path, flags in ((1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (0, os.devnull, os.O_RDONLY)):
        f = os.open(path, flags, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = list(req["argv"])
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (e.code is not None)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)

def report(*words):
    os.write(1, (" ".join(str(w) for w in words) + "\n").encode())

pending, live = b"", 0
while True:
    readable, _, _ = select.select([0], [], [], 0.02)
    if readable:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                run(json.loads(line))
            live += 1
            report("started", pid)
    while live:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        live -= 1
        report("exited", pid, os.waitstatus_to_exitcode(status))
while live:  # the test side closed our stdin: reap what is left
    os.waitpid(-1, 0)
    live -= 1
'''


class Zygote:
    """The zygote process and what it reported; ``run`` returns a pid, ``wait`` its status."""

    def __init__(self, env):
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self._exits = {}
        self._started = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True, name="torch-zygote")
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            kind, pid, *rest = line.decode().split()
            with self._cond:
                if kind == "started":
                    self._started.append(int(pid))
                else:
                    self._exits[int(pid)] = int(rest[0])
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def run(self, request_line, timeout=60.0):
        """Start one run (``request_line``: its JSON request); its pid."""
        with self._cond:
            seen = len(self._started)
            self.proc.stdin.write(request_line.encode() + b"\n")
            self.proc.stdin.flush()
            if not self._cond.wait_for(lambda: len(self._started) > seen or not self.alive(),
                                       timeout):
                raise RuntimeError("the torch zygote did not fork in time")
            if len(self._started) == seen:
                raise RuntimeError("the torch zygote died")
            return self._started[seen]

    def wait(self, pid, timeout):
        """The exit code of run ``pid``; ``subprocess.TimeoutExpired`` after ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: pid in self._exits or not self.alive(), timeout):
                raise subprocess.TimeoutExpired(str(pid), timeout)
            if pid not in self._exits:
                raise RuntimeError("the torch zygote died")
            return self._exits.pop(pid)

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        """Stop taking runs; the zygote reaps what is left and exits (killed if it hangs)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._reader.join(5)
