"""The process tree of a launch: start, watch, log, stop, and never leave one behind.

The launcher is the parent of every process it starts (the coordinator and the
workers on this machine). They run in a process group of their own, so a Ctrl-C
on the terminal reaches only the launcher, which turns it into a graceful stop:
SIGTERM to the coordinator, which checkpoints at the next step boundary and shuts
the world down; after ``run.grace_period`` seconds (or a second Ctrl-C) the whole
group gets SIGKILL. Every child also gets SIGKILL from the kernel if the launcher
itself dies (``DISTGRAD_PDEATHSIG``), so nothing outlives it.

A child's exit is seen at once (``waitpid``, polled every 0.1 s). When a process
fails, the others are killed; the outcome names the first process that failed,
the step, its exit status, and the root cause (the traceback the coordinator
collected, or the end of that process's log).
"""
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time

from distgrad.rpc.credentials import SECRET_ENV, new_world_secret
from distgrad.utils.cpus import format_cpus
from distgrad.utils.tempdirs import owned_tempdir

from . import checkpoint as ckpt
from .config import heartbeat_interval
from .environment import worker_cores
from .console import MetricsTail
from .grid import Grid
from .rundir import FAILURE, LAUNCH, LOGS, METRICS, PROCESSES, RESULT, read_json, write_json

__all__ = ["Supervisor", "Outcome"]

_POLL = 0.1            # seconds between checks of the children
_SHUTDOWN_WAIT = 15.0  # seconds the workers get to leave after the coordinator finished


class Outcome:
    """How a launch ended: ``code`` (the launcher's exit status) and what to tell."""

    def __init__(self, code, message, root_cause="", status="failed", step=None):
        self.code, self.message, self.root_cause = code, message, root_cause
        self.status, self.step = status, step

    @property
    def failed(self):
        return self.status == "failed"


class _Child:
    def __init__(self, rank, name, place, proc, log):
        self.rank, self.name, self.proc, self.log = rank, name, proc, log
        self.place = place      # "stage 1", "replica 0"...: see distgrad.launch.grid
        self.pid = proc.pid
        self.status = None      # exit code (negative: killed by that signal) once reaped
        self.killed = False     # we sent the kill: its exit is not a failure of its own
        self.partial = b""

    @property
    def running(self):
        return self.status is None

    def describe(self):
        return "coordinator" if self.rank == 0 else f"{self.name} (rank {self.rank}, {self.place})"


def describe_status(status):
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def exit_code(status):
    """The shell's convention: 128 + signal for a process killed by a signal."""
    return 128 - status if status < 0 else status


def _process_state(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


class Supervisor:
    """Starts this launcher's share of the world (``layout.ranks``) and watches it."""

    def __init__(self, run_dir, layout, launch, console, worker_modules, blas_threads):
        self.run_dir, self.layout, self.launch = run_dir, layout, launch
        self.console, self.worker_modules = console, worker_modules
        self.blas_threads = blas_threads
        self.config = launch["config"]
        self.cores = worker_cores(layout, blas_threads) \
            if self.config["world"]["pin_workers"] else {}
        self.children = []
        self.pgid = None
        self.signals = []
        self.stop_deadline = None
        self.killing = False
        self.failure = None     # the first child that failed on its own
        self.states = {}        # name -> /proc state of the others when it failed
        self.finished_at = None
        self.tail = MetricsTail(os.path.join(run_dir, METRICS))
        self.records = []
        self.started_at = None
        self.live = False       # this attempt's start record was seen (see _this_attempt)
        self._tmp = None
        self._selector = selectors.DefaultSelector()
        self.world_secret = new_world_secret()  # one per launch: its restarts keep it

    # -- starting --
    def start(self, resume_from=None, attempt=0):
        os.makedirs(os.path.join(self.run_dir, LOGS), exist_ok=True)
        if 0 in self.layout.ranks:  # this attempt's verdict, not an earlier one's, decides
            _set_aside_result(self.run_dir)
            try:
                os.unlink(os.path.join(self.run_dir, FAILURE))
            except FileNotFoundError:
                pass
        self.started_at = time.time()  # metrics records of this attempt are newer
        rendezvous = self.layout.rendezvous
        if rendezvous is None:  # local: a unix socket nobody else can collide with
            self._tmp = owned_tempdir("dg-launch-", "/tmp" if os.path.isdir("/tmp") else None)
            rendezvous = f"ipc://{self._tmp}/rendezvous-{attempt}.sock"
        workers = [f"worker{r}" for r in range(1, self.layout.world_size)]
        bind = self.layout.bind_addr or self.config["world"]["bind_addr"]
        self.transport = self.layout.transport or self.config["world"]["transport"]
        if 0 in self.layout.ranks:
            launch = dict(self.launch, resume_from=resume_from, attempt=attempt,
                          world={"init_method": rendezvous, "workers": workers,
                                 "bind_addr": bind, "transport": self.transport,
                                 "hosts": not self.layout.local})
            write_json(os.path.join(self.run_dir, LAUNCH), launch)
        try:
            for rank in self.layout.ranks:
                self._spawn(rank, "coordinator" if rank == 0 else workers[rank - 1],
                            rendezvous, bind)
        except BaseException:  # those already started must not outlive a failed start
            self._kill_all()
            raise
        pids = {"launcher": os.getpid(), "children": {c.rank: c.pid for c in self.children},
                "cores": {rank: format_cpus(cores) for rank, cores in self.cores.items()}}
        name = PROCESSES if self.layout.local else PROCESSES.replace(
            ".json", f"-rank{self.layout.ranks[0]}.json")
        write_json(os.path.join(self.run_dir, name), pids)

    def _command(self, rank, name, rendezvous, bind):
        if rank == 0:
            return [sys.executable, "-m", "distgrad.launch.rank0", self.run_dir]
        world = self.config["world"]
        cmd = [sys.executable, "-m", "distgrad", "worker", "--name", name, "--rank", str(rank),
               "--world-size", str(self.layout.world_size), "--init-method", rendezvous,
               "--transport", self.transport,
               *(["--bind-addr", bind] if bind != "auto" else []),
               "--rpc-timeout", str(world["rpc_timeout"]),
               "--rendezvous-timeout", str(world["rendezvous_timeout"]),
               "--heartbeat-timeout", str(world["heartbeat_timeout"]),
               "--heartbeat-interval", str(heartbeat_interval(world["heartbeat_timeout"]))]
        if world.get("simulated_link"):
            cmd += ["--simulated-link", world["simulated_link"]]
        if world["flush_denormal"]:
            cmd += ["--flush-denormal"]
        if rank in self.cores:
            cmd += ["--cpus", format_cpus(self.cores[rank])]
        for module in self.worker_modules:
            cmd += ["--allow", module]
        if not self.layout.local:  # the coordinator asks where each worker runs
            cmd += ["--allow", "distgrad.launch.placement"]
        return cmd

    def _environment(self):
        env = dict(os.environ)
        threads = str(self.blas_threads)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = threads
        env["DISTGRAD_PDEATHSIG"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        if self.layout.local and not env.get(SECRET_ENV):
            # this launcher forms the world: its secret goes to the members with the address
            env[SECRET_ENV] = self.world_secret
        # a child of this launcher takes its place from the command line, not from a
        # scheduler's variables meant for the launcher
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTGRAD_COORDINATOR"):
            env.pop(var, None)
        return env

    def _spawn(self, rank, name, rendezvous, bind):
        log = open(os.path.join(self.run_dir, LOGS, f"{rank}-{name}.log"), "ab")
        kwargs = {}
        if sys.version_info >= (3, 11):
            kwargs["process_group"] = self.pgid or 0
        else:  # pragma: no cover - Python 3.10
            group = self.pgid or 0
            kwargs["preexec_fn"] = lambda: os.setpgid(0, group)
        proc = subprocess.Popen(self._command(rank, name, rendezvous, bind),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=self._environment(), **kwargs)
        if self.pgid is None:
            self.pgid = proc.pid
        child = _Child(rank, name, Grid.of(self.config).describe(rank - 1) if rank else None,
                       proc, log)
        os.set_blocking(proc.stdout.fileno(), False)
        self._selector.register(proc.stdout, selectors.EVENT_READ, child)
        self.children.append(child)

    # -- watching --
    def on_signal(self, signum, _frame=None):
        self.signals.append(signum)

    def run(self):
        """Watch until every child has exited; return the :class:`Outcome`."""
        try:
            while any(c.running for c in self.children):
                self._pump(_POLL)
                self._reap()
                self._follow_metrics()
                self._police()
            self._drain()
        finally:
            self._kill_all()  # nothing is left behind, whatever happened above
            self._selector.close()
            for c in self.children:
                c.proc.stdout.close()
                c.log.close()
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
        self._follow_metrics()
        return self._outcome()

    def _pump(self, timeout):
        for key, _ in self._selector.select(timeout):
            child = key.data
            try:
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self._selector.unregister(key.fileobj)
                self._emit(child, child.partial, final=True)
                child.partial = b""
                continue
            child.log.write(chunk)
            child.log.flush()
            self._emit(child, child.partial + chunk)

    def _emit(self, child, data, final=False):
        lines = data.split(b"\n")
        child.partial = b"" if final else lines.pop()
        for line in lines:
            if line or not final:
                self.console.line(child.rank, child.name, line.decode("utf-8", "replace").rstrip())

    def _drain(self):
        """Output still in the pipes after the last exit (bounded: a grandchild may hold one)."""
        deadline = time.monotonic() + 1.0
        while self._selector.get_map() and time.monotonic() < deadline:
            self._pump(0.05)

    def _reap(self):
        for c in self.children:
            if not c.running:
                continue
            try:
                pid, status = os.waitpid(c.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = c.pid, 0
            if pid == 0:
                continue
            c.status = os.waitstatus_to_exitcode(status)
            c.proc.returncode = c.status  # reaped here: Popen must not wait for it again
            self._exited(c)

    def _exited(self, child):
        if child.killed or self.killing:
            return
        if child.status == 0:
            # the coordinator finished, or a worker left the world it shut down; a worker
            # that leaves early is reported by the coordinator, which then fails
            if child.rank == 0:
                self.finished_at = time.monotonic()
            return
        if self.signals:  # stopping anyway (e.g. interrupted before the coordinator was
            self._kill_all()  # ready for SIGTERM): not a failure of its own
            return
        if child.rank != 0 and self._training_finished():
            self.console.note(f"{child.describe()} {describe_status(child.status)} while the "
                              f"world shut down after training finished (see "
                              f"{os.path.relpath(child.log.name)})")
            return
        if child.rank != 0 and 0 in self.layout.ranks and self._follows_reported_failure(child):
            return  # the coordinator, exiting next here, is the one to report (see below)
        if self.failure is None:
            self.failure = child
            # how the others were doing before they are killed: a stopped one is the likely cause
            self.states = {c.name: _process_state(c.pid) for c in self.children if c.running}
        self._kill_all()

    def _follows_reported_failure(self, child):
        """Whether the coordinator (a child of this launcher) already reported a failure that
        is not ``child``'s own death: it then ends the world, which ends ``child`` with an
        error too; that exit, seen before the coordinator's, must not take the place of the
        report's cause."""
        report = read_json(os.path.join(self.run_dir, FAILURE))
        return bool(report) and not (report.get("worker") == child.name
                                     and report.get("reason") == "unreachable")

    def _training_finished(self):
        """The coordinator's verdict (a shared run directory shows it to every launcher)."""
        result = read_json(os.path.join(self.run_dir, RESULT))
        return bool(result) and result.get("status") == "finished"

    def _follow_metrics(self):
        if 0 not in self.layout.ranks:  # the coordinator's launcher shows the progress
            return
        records = self.tail.read()
        if self.tail.restarted:
            self.records = []
        if records:
            self.records.extend(records)
            self.console.metrics(self._this_attempt(records))

    def _this_attempt(self, records):
        """The records from this attempt's start on: a resumed run's metrics begin with
        its history (up to the checkpoint), which is the past, not progress to show."""
        if self.live:
            return records
        for i, record in enumerate(records):
            if record.get("event") == "start" and record.get("time", 0) >= self.started_at:
                self.live = True
                return records[i:]
        return []

    def _police(self):
        now = time.monotonic()
        if self.signals and self.stop_deadline is None:
            grace = self.config["run"]["grace_period"]
            self.stop_deadline = now + grace
            coordinator = next((c for c in self.children if c.rank == 0 and c.running), None)
            if coordinator is not None:
                self.console.note(f"stopping at the next step boundary with a checkpoint "
                                  f"(grace {grace:g} s; Ctrl-C again to kill now)")
                os.kill(coordinator.pid, signal.SIGTERM)
        if len(self.signals) > 1 and not self.killing:
            self.console.note("second interrupt: killing every process")
            self._kill_all()
        elif self.stop_deadline is not None and now > self.stop_deadline and not self.killing:
            self.console.note("grace period over: killing every process")
            self._kill_all()
        elif self.finished_at is not None and now > self.finished_at + _SHUTDOWN_WAIT \
                and not self.killing:
            self.console.note("workers did not leave after the run finished: killing them")
            self._kill_all()

    def _kill_all(self):
        self.killing = True
        for c in self.children:
            if c.running:
                c.killed = True
                try:
                    os.kill(c.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.pgid is not None:  # and anything they started
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for c in self.children:
            if c.running:
                try:
                    _, status = os.waitpid(c.pid, 0)
                    c.status = os.waitstatus_to_exitcode(status)
                except ChildProcessError:
                    c.status = -signal.SIGKILL
                c.proc.returncode = c.status

    # -- the verdict --
    def _last_step(self):
        return max((r.get("step", 0) for r in self.records if "loss" in r), default=0)

    def _outcome(self):
        if self.failure is not None:
            return self._failure_outcome()
        result = read_json(os.path.join(self.run_dir, RESULT))
        if self.signals:
            sig = self.signals[0]
            step = result.get("step") if result else self._last_step()
            saved = ckpt.latest(self.run_dir)
            where = f"; last checkpoint: step {saved[1]['step']}" if saved else ""
            return Outcome(128 + sig, f"stopped by {signal.Signals(sig).name} at step {step}"
                                      f"{where}", status="stopped", step=step)
        if 0 in self.layout.ranks and (result is None or result.get("status") != "finished"):
            return Outcome(1, "the coordinator ended without a result", status="failed")
        return Outcome(0, "finished", status="finished",
                       step=result.get("step") if result else None)

    def _failure_outcome(self):
        first = self.failure
        report = read_json(os.path.join(self.run_dir, FAILURE))
        if report and report["worker"] == first.name:
            report = None  # it died on its own: its exit status says more than "unreachable"
        if report:  # the coordinator found a stage at fault (and then left the world, which
            # may have ended the other workers before the coordinator itself was seen to exit)
            step = report["step"]
            host = report.get("host")
            if host:  # every rank there stopped answering at once
                ranks = ", ".join(f"{w} (rank {r})" for w, r in zip(host["workers"],
                                                                    host["ranks"]))
                message = f"host {host['label']} is lost: {ranks} stopped answering at " \
                          f"step {step}"
                return Outcome(1, message, report.get("message", ""), step=step)
            if report["reason"] == "unreachable":
                how = "stopped answering" + (" (its process was stopped, state T)"
                                             if self.states.get(report["worker"]) == "T" else "")
            else:
                how = f"failed: {report['message'].splitlines()[0] if report['message'] else ''}"
            on = f", on {report['on']}" if report.get("on") else ""
            message = f"{report['worker']} (rank {report['rank']}, {report['place']}{on}) " \
                      f"{how} at step {step}"
            cause = report.get("traceback") or report.get("message", "")
            return Outcome(1, message, cause, step=step)
        lost = None if 0 in self.layout.ranks else _lost_coordinator(first.log.name)
        if lost:  # rank 0's host is gone, or unreachable from here
            where = f" on {self.layout.host}" if self.layout.host else ""
            return Outcome(exit_code(first.status), f"{first.describe()} lost the coordinator "
                           f"(rank 0){where}: {lost.partition('unreachable: ')[2]}", lost)
        step = self._last_step() + 1
        # only the coordinator's launcher follows the steps (the others may be elsewhere)
        at = "" if 0 not in self.layout.ranks else \
            f" at step {step}" if self.live else " before training started"
        message = f"{first.describe()} {describe_status(first.status)}{at}"
        return Outcome(exit_code(first.status), message, _log_tail(first.log.name), step=step)


def _set_aside_result(run_dir):
    """Move an earlier attempt's ``result.json`` out of the way: a finished run that is
    continued keeps its result as ``result-step<N>.json`` (failed or stopped ones go)."""
    path = os.path.join(run_dir, RESULT)
    result = read_json(path)
    try:
        if result and result.get("status") == "finished":
            os.replace(path, os.path.join(run_dir, RESULT.replace(
                ".json", f"-step{result.get('step')}.json")))
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


_LOST_COORDINATOR = re.compile(r"worker 'coordinator' \(rank 0\) is unreachable: [^\n]*")


def _lost_coordinator(path):
    """The line of a worker's log that says it lost the coordinator (None: it did not)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = _LOST_COORDINATOR.search(fh.read())
    except OSError:
        return None
    return found and found.group(0)


def _log_tail(path, lines=25):
    """The end of a log, from its last traceback if there is one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read().splitlines()
    except OSError:
        return ""
    start = max((i for i, line in enumerate(text) if line.startswith("Traceback")),
                default=max(0, len(text) - lines))
    return "\n".join(text[start:][-lines * 2:])
