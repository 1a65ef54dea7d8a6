"""A world of local worker processes plus this process as rank 0 (what the pytest plugin starts).

    world = World(2).start()     # worker1 and worker2 serve; this process is worker0
    rpc.rpc_sync("worker1", operator.add, (1, 2))
    world.pause("worker2")       # SIGSTOP: alive but silent; world.resume("worker2")
    world.faults.drop(fn=mylib.step, nth=2)    # message faults, on every rank
    world.kill("worker2")        # SIGKILL
    world.close()                # graceful shutdown, then every worker is reaped

Workers are ``distgrad worker`` processes forked by a fork server that has already
imported distgrad (``forkserver.py``: milliseconds instead of a fresh interpreter),
or spawned as ``python -m distgrad worker`` when the world sets environment variables
that must be seen at import time. Either way they import what this process imports
(its ``sys.path``: the test's own modules, conftest folders) and work in its working
directory (a relative path means the same file on every rank), allow the test modules
named in ``test_modules`` (and can load them even when pytest imported them by file
path), allow the harness's own helpers (``distgrad.testing.remote``), and print their
stacks and pending calls on SIGUSR1. Endpoints are ipc:// paths in a fresh temp dir or
tcp port 0, so ``pytest -n auto`` is safe.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from distgrad.rpc import api
from distgrad.rpc.credentials import SECRET_ENV, new_world_secret
from distgrad.rpc.options import RpcBackendOptions
from distgrad.rpc.rendezvous import RendezvousServer
from distgrad.rpc.agent import IPC_DIR_PREFIX
from distgrad.rpc.allowlist import ADVICE_ENV
from distgrad.utils.tempdirs import owned_tempdir, sweep_stale

from . import forkserver
from .spmd import HARNESS_MODULE, TEST_MODULES_ENV

__all__ = ["World", "HARNESS_MODULE"]

_ROOT = str(Path(__file__).resolve().parents[2])

#: The signal that makes a world's worker print its stacks and pending calls.
DUMP_SIGNAL = signal.SIGUSR1
#: RpcBackendOptions fields a World passes on to its workers, and their worker flags.
_WORKER_FLAGS = {"rpc_timeout": "--rpc-timeout", "heartbeat_interval": "--heartbeat-interval",
                 "heartbeat_timeout": "--heartbeat-timeout", "shm_threshold": "--shm-threshold",
                 "max_inflight_per_worker": "--max-inflight",
                 "max_message_size": "--max-message-size",
                 "rendezvous_timeout": "--rendezvous-timeout",
                 "simulated_link": "--simulated-link", "authenticate": "--authenticate"}


def _read_at_runtime(env):
    """Whether distgrad reads these variables when it runs (so a forked worker sees them),
    not when a module is imported (numpy's thread counts, hash seeds...)."""
    return all(k.startswith("DISTGRAD_") for k in env)


class World:
    """``n`` worker processes ``worker1..workerN``; this process joins as ``worker0``.

    ``options`` are RpcBackendOptions fields for this process and (where they map to
    command-line flags or environment) for the workers; ``worker_env`` adds
    environment variables for the workers only; ``init_driver=False`` leaves rank 0
    to the caller (``self.init_method`` is then the rendezvous address);
    ``test_modules`` ({module name: file}) are trusted on every rank; ``import_paths``
    go on the workers' import path after this process's; ``start_method`` is "fork"
    (through the fork server) or "spawn" (default: fork, unless ``worker_env`` sets
    variables read at import time); ``allow_advice`` is what a refused module's error
    tells to do, on every rank ("{module}" stands for the module; default: init_rpc's
    options, see :data:`distgrad.rpc.allowlist.ADVICE_ENV`).

    ``hosts`` spreads the workers over simulated hosts (``hosts.py``), worker ``i`` on host
    ``(i - 1) % len(hosts)``, this process on the switch too: a number makes that many
    (removed when the world closes), or pass :class:`~distgrad.testing.hosts.SimulatedHosts`
    made with ``attach_caller=True``. Endpoints are then TCP, each process's address the
    one it chose toward the rendezvous (this process's), as across real hosts.
    """

    def __init__(self, n, transport="ipc", worker_env=None, init_driver=True, grace=10.0,
                 test_modules=None, import_paths=(), start_method=None, allow_advice=None,
                 hosts=None, **options):
        self.hosts, self._own_hosts = _hosts_for(hosts)
        if self.hosts is not None:
            transport = "tcp"  # unix sockets do not cross hosts
            start_method = "spawn"
        self.n, self.transport, self.grace = n, transport, grace
        self.allow_advice = allow_advice
        self.worker_env = dict(worker_env or {})
        self.init_driver = init_driver
        self.test_modules = dict(test_modules or {})
        self.import_paths = list(import_paths)
        if start_method is None:  # fork where forking a clean server is known to be safe
            start_method = "fork" if sys.platform.startswith("linux") \
                and _read_at_runtime(self.worker_env) else "spawn"
        if start_method not in ("fork", "spawn"):
            raise ValueError(f"start_method must be 'fork' or 'spawn', not {start_method!r}")
        self.start_method = start_method
        # the world's secret, made here as the world is formed here (as the launcher does)
        options.setdefault("world_secret", new_world_secret())
        self.options = options
        self.names = [f"worker{i}" for i in range(n + 1)]
        self.procs = {}
        self.logs = {}
        self.final_logs = {}     # name -> log text, kept when close() removes the files
        self.killed, self.paused = set(), set()
        self.dir = owned_tempdir("dgw-", "/tmp" if os.path.isdir("/tmp") else None)
        self._ctx = None
        self._faults = None
        self.closed = False
        self.shutdown_error = None

    @property
    def world_size(self):
        return self.n + 1

    @property
    def allowed_modules(self):
        """What rank 0 allows: the options' modules and the test modules."""
        return list(dict.fromkeys([*self.options.get("allowed_modules", ()),
                                   *self.test_modules]))

    def start(self):
        self._ctx = zmq.Context()
        curve = None
        if self.options.get("curve_public_key"):
            curve = (self.options["curve_public_key"], self.options["curve_secret_key"])
        secret = self.options["world_secret"]
        secret = secret.encode() if isinstance(secret, str) else secret
        if self.hosts is not None:
            address = f"tcp://{self.hosts.caller_address}:0"
        elif self.transport == "ipc":
            address = f"ipc://{self.dir}/rdv.sock"
        else:
            address = "tcp://127.0.0.1:0"
        server = RendezvousServer(self._ctx, address, curve, secret)
        self.init_method = server.address
        try:
            for i in range(1, self.n + 1):
                self.spawn(i)
            if self.init_driver:
                options = dict(self.options, allowed_modules=self.allowed_modules)
                opts = RpcBackendOptions(init_method=self.init_method, transport=self.transport,
                                         ipc_dir=self.dir, **options)
                api.init_rpc("worker0", rank=0, world_size=self.n + 1, rpc_backend_options=opts,
                             _rendezvous_server=server)
                if self.allow_advice:
                    from distgrad.rpc import current_agent
                    current_agent().allowlist.advice = self.allow_advice
                self._end_rendezvous(server)
        except BaseException:
            self.close(show_logs=True, graceful=False)
            raise
        return self

    def _end_rendezvous(self, server):
        """The world is complete: end the rendezvous server's thread now, not at shutdown,
        where joining it waits for the rest of its poll slice (up to 0.2 s). A message
        wakes its poll; it then sees that it was stopped (the message is answered with an
        error nobody reads)."""
        server.stop(timeout=0)
        s = self._ctx.socket(zmq.DEALER)
        try:
            s.linger = 100  # ms: time to connect and deliver after close()
            s.connect(server.address)
            s.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:  # it polls on: the shutdown waits for it as before
            pass
        finally:
            s.close()

    # ------------------------------------------------------------------ processes
    def _worker_paths(self):
        paths = [os.path.abspath(p or os.getcwd()) for p in sys.path] + [_ROOT] + self.import_paths
        return list(dict.fromkeys(p for p in paths if p))

    def _worker_environ(self, paths, env):
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, e.get("PYTHONPATH", "")]))
        e["DISTGRAD_PDEATHSIG"] = "1"
        e.pop("RANK", None), e.pop("WORLD_SIZE", None)
        if self.test_modules:
            e[TEST_MODULES_ENV] = json.dumps(self.test_modules)
        if self.allow_advice:
            e[ADVICE_ENV] = self.allow_advice
        secret = self.options["world_secret"]
        e[SECRET_ENV] = secret.decode() if isinstance(secret, bytes) else secret
        if self.options.get("curve_public_key"):
            e["DISTGRAD_CURVE_PUBLIC_KEY"] = self.options["curve_public_key"].decode()
            e["DISTGRAD_CURVE_SECRET_KEY"] = self.options["curve_secret_key"].decode()
        e.update(self.worker_env)
        e.update(env or {})
        return e

    def spawn(self, rank, extra_args=(), env=None):
        """Start (or restart) the worker of ``rank``; ``env`` adds variables for it alone."""
        name = self.names[rank]
        log_path = os.path.join(self.dir, f"{name}.log")
        self.logs[name] = log_path
        argv = ["--name", name, "--rank", str(rank), "--world-size", str(self.n + 1),
                "--init-method", self.init_method, "--transport", self.transport,
                "--dump-signal", DUMP_SIGNAL.name]
        for m in dict.fromkeys([*self.allowed_modules, HARNESS_MODULE]):
            argv += ["--allow", m]
        for option, flag in _WORKER_FLAGS.items():
            if option in self.options:
                argv += [flag, str(self.options[option])]
        argv += list(extra_args)
        paths = self._worker_paths()
        e = self._worker_environ(paths, env)
        self.killed.discard(name)
        self.paused.discard(name)
        if self.hosts is not None:
            with open(log_path, "ab") as log:
                self.procs[name] = self.host_of(name).popen(
                    [sys.executable, "-m", "distgrad", "worker", *argv], stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e)
        elif self.start_method == "fork" and _read_at_runtime(env or {}):
            server = forkserver.fork_server([_ROOT, *sys.path])
            pid = server.fork(argv, e, os.getcwd(), paths, log_path)
            self.procs[name] = forkserver.ForkedProcess(server, pid, ["distgrad worker", *argv])
        else:
            with open(log_path, "ab") as log:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "distgrad", "worker", *argv], stdout=log,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e)
        return self.procs[name]

    def host_of(self, name):
        """The simulated host worker ``name`` runs on (None: this machine)."""
        if self.hosts is None:
            return None
        return self.hosts[(self.names.index(name) - 1) % len(self.hosts)]

    def pids(self):
        """{name: pid} of every process of the world, this one included."""
        return {self.names[0]: os.getpid(), **{n: p.pid for n, p in self.procs.items()}}

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def kill(self, name, sig=signal.SIGKILL):
        """Send ``sig`` (default SIGKILL) to worker ``name`` and wait for it to exit."""
        p = self.procs[name]
        self.killed.add(name)
        if name in self.paused:
            p.send_signal(signal.SIGCONT)
            self.paused.discard(name)
        p.send_signal(sig)
        p.wait(10)

    def lose_host(self, host):
        """Simulated host ``host`` (a :class:`~distgrad.testing.hosts.Host` of this world)
        vanishes: its link goes down and every process on it is killed, as in a power
        failure; its workers count as killed."""
        host.link_down()
        host.kill_all()
        for name in self.names[1:]:
            if self.host_of(name) is host:
                self.killed.add(name)
                self.procs[name].wait(10)

    def pause(self, name, timeout=5.0):
        """SIGSTOP worker ``name``: its process lives but neither computes nor answers
        (its peers report it unreachable after the heartbeat timeout). Returns once every
        thread of it has stopped: a signal is only queued when ``kill`` returns, and a
        running worker could still answer a message sent right after."""
        pid = self.procs[name].pid
        self.procs[name].send_signal(signal.SIGSTOP)
        self.paused.add(name)
        deadline = time.monotonic() + timeout
        while not _stopped(pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} (pid {pid}) did not stop within {timeout:g} s "
                                   "of SIGSTOP")
            time.sleep(0.001)

    def resume(self, name):
        """SIGCONT a paused worker."""
        self.procs[name].send_signal(signal.SIGCONT)
        self.paused.discard(name)

    def signal(self, name, sig):
        self.procs[name].send_signal(sig)

    # ------------------------------------------------------------------ harness calls
    def remote(self, name, function, *args, timeout=30.0):
        """Call ``distgrad.testing.remote.<function>(*args)`` on worker ``name``."""
        return api.rpc_sync(name, f"{HARNESS_MODULE}:{function}", args, timeout=timeout)

    def reachable(self):
        """Names of the workers that run, are not paused, and rank 0 can reach."""
        from distgrad.rpc import current_agent
        agent = current_agent()
        return [n for r, n in enumerate(self.names) if r > 0 and self.alive(n)
                and n not in self.paused and agent is not None and agent.unreachable(r) is None]

    def remote_all(self, function, *args, timeout=5.0):
        """({name: result}, {name: error}) of the harness call on every reachable worker
        (concurrently); a worker that dies or leaves meanwhile is in neither."""
        futs = {n: api.rpc_async(n, f"{HARNESS_MODULE}:{function}", args, timeout=timeout)
                for n in self.reachable()}
        out, errors = {}, {}
        for n, f in futs.items():
            try:
                out[n] = f.wait()
            except Exception as e:  # noqa: BLE001 - it died or left: nothing to ask it any more
                if n in self.reachable():
                    errors[n] = e
        return out, errors

    @property
    def faults(self):
        """Message faults on every rank of this world (:class:`~distgrad.testing.faults.Faults`)."""
        if self._faults is None:
            from .faults import Faults
            self._faults = Faults(self)
        return self._faults

    def clear_faults(self):
        """Remove every fault rule of this world (if it has any), on every rank."""
        if self._faults is not None:
            self._faults.clear()

    # ------------------------------------------------------------------ logs
    def log_size(self, name):
        try:
            return os.path.getsize(self.logs[name])
        except (OSError, KeyError):
            return 0

    def log_text(self, name, start=0):
        """Worker ``name``'s output (from byte ``start``), also after close()."""
        if name in self.final_logs:
            return self.final_logs[name][start:]
        try:
            with open(self.logs[name], "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")
        except (OSError, KeyError):
            return ""

    # ------------------------------------------------------------------ closing
    def close(self, show_logs=False, graceful=True):
        if self.closed:
            return
        self.closed = True
        try:
            for name in list(self.paused):
                self.resume(name)
            if self._faults is not None:
                self._faults.uninstall_here()
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
            for name in self.procs:
                self.final_logs[name] = self.log_text(name)
            shutil.rmtree(self.dir, ignore_errors=True)
            sweep_stale(IPC_DIR_PREFIX)  # the socket directories of workers that were killed
            if self._own_hosts:
                self.hosts.close()

    def _all_alive(self):
        return all(p.poll() is None for p in self.procs.values())


def _hosts_for(hosts):
    """(the simulated hosts of a world, whether it made them) for World's ``hosts``."""
    if hosts is None:
        return None, False
    from .hosts import SimulatedHosts
    if isinstance(hosts, int):
        return SimulatedHosts(hosts, attach_caller=True), True
    if getattr(hosts, "caller_address", None) is None:
        raise ValueError("a World on simulated hosts needs them made with attach_caller=True "
                         "(this process, rank 0, joins them on the switch)")
    return hosts, False


def _stopped(pid):
    """Whether every thread of process ``pid`` is stopped by a signal (Linux /proc), or it
    is gone; True where /proc cannot tell."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True  # gone, or no /proc to ask
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t", "Z", "X"):
            return False
    return True

