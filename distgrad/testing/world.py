"""A world of local worker processes plus this process as rank 0 (used by ``rpc_world``)."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from distgrad.rpc import api
from distgrad.rpc.options import RpcBackendOptions
from distgrad.rpc.rendezvous import RendezvousServer
from distgrad.utils.tempdirs import owned_tempdir

_ROOT = str(Path(__file__).resolve().parents[2])

#: RpcBackendOptions fields a World passes on to its workers, and their worker flags.
_WORKER_FLAGS = {"rpc_timeout": "--rpc-timeout", "heartbeat_interval": "--heartbeat-interval",
                 "heartbeat_timeout": "--heartbeat-timeout", "shm_threshold": "--shm-threshold",
                 "max_inflight_per_worker": "--max-inflight",
                 "max_message_size": "--max-message-size",
                 "rendezvous_timeout": "--rendezvous-timeout"}


class World:
    """``n`` worker processes ``worker1..workerN``; this process joins as ``worker0``.

    ``options`` are RpcBackendOptions fields for this process and (where they map to
    command-line flags or environment) for the workers; ``worker_env`` adds
    environment variables for the workers only; ``init_driver=False`` leaves rank 0
    to the caller (``self.init_method`` is then the rendezvous address).
    """

    def __init__(self, n, transport="ipc", worker_env=None, init_driver=True, grace=10.0, **options):
        self.n, self.transport, self.grace = n, transport, grace
        self.worker_env = dict(worker_env or {})
        self.init_driver = init_driver
        self.options = options
        self.names = [f"worker{i}" for i in range(n + 1)]
        self.procs = {}
        self.logs = {}
        self.dir = owned_tempdir("dgw-", "/tmp" if os.path.isdir("/tmp") else None)
        self._ctx = None
        self.shutdown_error = None

    def start(self):
        self._ctx = zmq.Context()
        curve = None
        if self.options.get("curve_public_key"):
            curve = (self.options["curve_public_key"], self.options["curve_secret_key"])
        if self.transport == "ipc":
            server = RendezvousServer(self._ctx, f"ipc://{self.dir}/rdv.sock", curve)
        else:
            server = RendezvousServer(self._ctx, "tcp://127.0.0.1:0", curve)
        self.init_method = server.address
        try:
            for i in range(1, self.n + 1):
                self.spawn(i)
            if self.init_driver:
                opts = RpcBackendOptions(init_method=self.init_method, transport=self.transport,
                                         ipc_dir=self.dir, **self.options)
                api.init_rpc("worker0", rank=0, world_size=self.n + 1, rpc_backend_options=opts,
                             _rendezvous_server=server)
        except BaseException:
            self.close(show_logs=True, graceful=False)
            raise
        return self

    def spawn(self, rank, extra_args=(), env=None):
        name = self.names[rank]
        log_path = os.path.join(self.dir, f"{name}.log")
        self.logs[name] = log_path
        cmd = [sys.executable, "-m", "distgrad", "worker", "--name", name, "--rank", str(rank),
               "--world-size", str(self.n + 1), "--init-method", self.init_method,
               "--transport", self.transport]
        for m in self.options.get("allowed_modules", ()):
            cmd += ["--allow", m]
        for option, flag in _WORKER_FLAGS.items():
            if option in self.options:
                cmd += [flag, str(self.options[option])]
        cmd += list(extra_args)
        e = dict(os.environ)
        # workers import what this process imports: its import path (the test's own
        # modules, conftest folders), then distgrad's source root
        paths = [os.path.abspath(p or os.getcwd()) for p in sys.path] + [_ROOT, e.get("PYTHONPATH")]
        e["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
        e["DISTGRAD_PDEATHSIG"] = "1"
        e.pop("RANK", None), e.pop("WORLD_SIZE", None)
        if self.options.get("curve_public_key"):
            e["DISTGRAD_CURVE_PUBLIC_KEY"] = self.options["curve_public_key"].decode()
            e["DISTGRAD_CURVE_SECRET_KEY"] = self.options["curve_secret_key"].decode()
        e.update(self.worker_env)
        e.update(env or {})
        with open(log_path, "ab") as log:
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=e, cwd=self.dir)
        return self.procs[name]

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs[name]
        p.send_signal(sig)
        p.wait(10)

    def log_text(self, name):
        try:
            return Path(self.logs[name]).read_text(errors="replace")
        except OSError:
            return ""

    def close(self, show_logs=False, graceful=True):
        try:
            if self.init_driver:
                try:
                    api.shutdown(graceful=graceful, timeout=self.grace + 5)
                except Exception as e:  # noqa: BLE001 - report, but reap the children anyway
                    self.shutdown_error = e
                    show_logs = show_logs or self._all_alive()  # a killed worker is expected
                    try:
                        api.shutdown(graceful=False)
                    except Exception:
                        pass
            deadline = time.monotonic() + self.grace
            for name, p in self.procs.items():
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    show_logs = True
                    sys.stderr.write(f"{name} did not exit within {self.grace} s: killed\n")
                    p.kill()
                    p.wait(10)
            if show_logs:
                for name in self.procs:
                    sys.stderr.write(f"\n----- log of {name} (exit {self.procs[name].returncode}) "
                                     f"-----\n{self.log_text(name)}")
        finally:
            for p in self.procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            if self._ctx is not None:
                self._ctx.destroy(linger=0)
                self._ctx = None
            shutil.rmtree(self.dir, ignore_errors=True)

    def _all_alive(self):
        return all(p.poll() is None for p in self.procs.values())
