"""Worker processes in milliseconds: a fork server that has already imported distgrad.

Starting a worker with a fresh interpreter costs importing NumPy, pyzmq and distgrad
again: 0.3 to 0.8 s of CPU, most of a small multi-process test. A fork server pays it
once per test process, as multiprocessing's ``forkserver`` method does: it is started
clean (a fresh interpreter: no ZeroMQ context, no thread, nothing to inherit badly),
imports what a worker imports, and then forks one worker per request. The child
gets the request's environment, working directory, import path and log file, and
runs ``distgrad.worker.main(argv)``, exactly as ``python -m distgrad worker`` would.

Requests and events are JSON lines on the server's stdin and stdout (nothing is
pickled)::

    parent -> server   {"argv": [...], "env": {...}, "cwd": dir, "path": [...], "log": file}
    server -> parent   {"ready": pid}                  once, after the imports
                       {"pid": pid} | {"error": text}  answer to a request, in order
                       {"exit": pid, "code": code}     whenever a worker exits (code < 0:
                                                       killed by signal -code, as Popen)

The server dies with its parent (PDEATHSIG, and end-of-file on its stdin kills its
workers first); each worker dies with the server. Variables that act when a module
is imported (``OMP_NUM_THREADS``, ``PYTHONHASHSEED``...) were read by the server:
worlds that set such variables for their workers start them with ``spawn`` instead.
"""
import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["ForkServer", "ForkedProcess", "fork_server", "serve"]

#: What a worker imports: the server imports it once for all of them. The harness's
#: helpers, pytest and its assertion rewriter are for the tests the workers serve.
PRELOAD = ("distgrad", "distgrad.worker", "distgrad.rpc.api", "distgrad.testing.remote",
           "pytest", "_pytest.assertion.rewrite")


class ForkServer:
    """The test process's side: start the server, fork workers through it, learn their exits."""

    def __init__(self, path):
        """``path``: the server's import path, distgrad's own root first."""
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), DISTGRAD_PDEATHSIG="1")
        self._stderr = tempfile.TemporaryFile()  # read only if the server fails to start
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from distgrad.testing.forkserver import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env,
            cwd=path[0], close_fds=True)  # -c puts its cwd first: that of distgrad itself
        self._out = self.proc.stdout.fileno()
        self._buf = b""
        self._exits = {}      # pid -> exit code
        self._answers = []    # answers to requests not yet taken
        self._ready = False
        self._lock = threading.RLock()

    @property
    def pid(self):
        return self.proc.pid

    def fds(self):
        """This side's file descriptors of the server (not a test's leak)."""
        return {self.proc.stdin.fileno(), self._out, self._stderr.fileno()}

    def alive(self):
        return self.proc.poll() is None

    # ------------------------------------------------------------------ events
    def _read(self, timeout):
        """Read what the server wrote within ``timeout`` s; False once it is gone."""
        ready, _, _ = select.select([self._out], [], [], max(0.0, timeout))
        if not ready:
            return True
        chunk = os.read(self._out, 65536)
        if not chunk:
            return False
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if "exit" in event:
                self._exits[event["exit"]] = event["code"]
            elif "ready" in event:
                self._ready = True
            else:
                self._answers.append(event)
        return True

    def _until(self, done, timeout):
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                return done()
        return True

    def wait_ready(self, timeout=60.0):
        with self._lock:
            if not self._until(lambda: self._ready, timeout):
                self._stderr.seek(0)
                why = self._stderr.read().decode(errors="replace").strip()[-2000:]
                raise RuntimeError("the distgrad fork server did not start "
                                   f"(exit code {self.proc.poll()}): {why}")

    # ------------------------------------------------------------------ workers
    def fork(self, argv, env, cwd, path, log):
        """Start ``distgrad worker argv`` in a child of the server; its pid."""
        request = json.dumps({"argv": list(argv), "env": env, "cwd": cwd, "path": list(path),
                              "log": log}).encode() + b"\n"
        with self._lock:
            self.wait_ready()
            self.proc.stdin.write(request)
            self.proc.stdin.flush()
            if not self._until(lambda: self._answers, 30.0):
                raise RuntimeError("the distgrad fork server did not answer")
            answer = self._answers.pop(0)
        if "error" in answer:
            raise RuntimeError(f"the distgrad fork server could not fork: {answer['error']}")
        return answer["pid"]

    def exit_code(self, pid, timeout=0.0):
        """The exit code of worker ``pid``, or None while it runs (waits up to ``timeout``)."""
        with self._lock:
            self._until(lambda: pid in self._exits or not self.alive(), timeout)
            if pid not in self._exits and not self.alive():
                return -signal.SIGKILL  # the server died, and its workers with it
            return self._exits.get(pid)

    def close(self):
        """Stop the server (it kills and reaps what it still runs)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc.stdout.close()
        self._stderr.close()


class ForkedProcess:
    """A worker forked by the server, with the part of ``subprocess.Popen``'s interface
    that a world uses: ``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, server, pid, args):
        self.server, self.pid, self.args = server, pid, args
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, 1e9 if timeout is None else timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:  # not yet reaped by the server: the pid is still ours
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)


_server = None
_server_lock = threading.Lock()


def fork_server(path):
    """This process's fork server (started on first use, again if it died; stopped at exit)."""
    global _server
    with _server_lock:
        if _server is not None and not _server.alive():
            _server.close()
            _server = None
        if _server is None:
            _server = ForkServer(path)
        return _server


def running_server():
    """This process's fork server if it runs, else None (never starts one)."""
    return _server if _server is not None and _server.alive() else None


def stop_server():
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


atexit.register(stop_server)


# ---------------------------------------------------------------------- the server
def _send(event):
    try:
        os.write(1, json.dumps(event).encode() + b"\n")
    except OSError:  # the parent is gone: nobody to tell
        pass


def _reap(children):
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(request, server_fds):
    """In the forked child: become the requested worker; never return to the server loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = request["path"]
        from distgrad.worker import main
        code = main(request["argv"])
    except SystemExit as e:  # argparse's errors
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - say why in the worker's log, then exit
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


def serve():
    """The server's main loop (run by ``ForkServer`` in a fresh interpreter)."""
    from distgrad.utils.processes import die_with_parent
    die_with_parent()
    import importlib
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # pytest is optional for plain worlds
            pass
    from distgrad.rpc.allowlist import default_entry_points
    default_entry_points()  # computed once here, not on every worker's first call
    import gc
    gc.collect()
    gc.freeze()  # a worker's collections skip (and do not copy-on-write) all this
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = set()
    _send({"ready": os.getpid()})
    buf = b""
    while True:
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            _reap(children)
        if 0 in ready:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    request = json.loads(line)
                    pid = os.fork()
                except Exception as e:  # noqa: BLE001 - answer, and keep serving
                    _send({"error": f"{type(e).__name__}: {e}"})
                    continue
                if pid == 0:
                    _child(request, (wake_r, wake_w))
                children.add(pid)
                _send({"pid": pid})
    # the parent closed our stdin (or died): take every worker down with us
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in list(children):
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
