"""The workers of one node for one round of a torchrun launch: started together with
torchrun's environment, watched, stopped together; how a failure is recorded (also for
the agents of other nodes) and reported (torchrun's :class:`ChildFailedError`).

A worker runs in a session of its own (a signal to the agent's terminal does not reach
it twice) and dies with its agent, also when the agent is killed (``PR_SET_PDEATHSIG``).
"""
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime

__all__ = ["ChildFailedError", "SignalException", "Failure", "WorkerGroup", "assign_ranks"]

_PR_SET_PDEATHSIG = 1


class ChildFailedError(Exception):
    """A worker failed after every allowed restart (torchrun's exception of that name)."""

    def __init__(self, name, failures):
        self.name = name
        self.failures = failures  # [Failure], the first observed first
        super().__init__(self.format_msg())

    def get_first_failure(self):
        """(rank, failure) of the first failure observed (PyTorch's method)."""
        root = self.failures[0]
        return root.rank, root

    def format_msg(self, boarder_delim="=", section_delim="-"):
        width = 60
        root, *others = self.failures
        lines = [boarder_delim * width, f"{self.name} FAILED", section_delim * width,
                 "Failures:"]
        lines += [_format_failure(i + 1, f) for i, f in enumerate(others)] or \
            ["  <NO_OTHER_FAILURES>"]
        lines += [section_delim * width, "Root Cause (first observed failure):",
                  _format_failure(0, root), boarder_delim * width]
        return "\n" + "\n".join(lines)


class SignalException(Exception):
    """The agent got a signal it handles (``--signals-to-handle``); the workers were stopped."""

    def __init__(self, msg, sigval):
        super().__init__(msg)
        self.sigval = sigval


class Failure:
    """One worker that failed, or (``exitcode`` None) one lost with its host. It travels
    to the other nodes' agents as :meth:`record`, so that each can report it."""

    def __init__(self, rank, local_rank, pid, exitcode, error_file, host=None, message=None,
                 time_text=None):
        self.rank, self.local_rank, self.pid = rank, local_rank, pid
        self.exitcode, self.error_file = exitcode, error_file
        self.host = host or socket.getfqdn()
        self.time = time_text or datetime.now().strftime("%Y-%m-%d_%H:%M:%S")
        self.message = message if message is not None or error_file is None else \
            _error_file_message(error_file)

    def describe(self):
        if self.exitcode is None:
            return self.message
        return f"rank {self.rank} (local rank {self.local_rank}) on {self.host} exited " \
               f"with {self.exitcode}"

    def record(self):
        return [self.rank, self.local_rank, self.pid, self.exitcode, self.error_file,
                self.host, self.message, self.time]

    @classmethod
    def from_record(cls, record):
        """The failure of a :meth:`record` (from another agent); ValueError if malformed."""
        if type(record) is not list or len(record) != 8:
            raise ValueError("a failure record is a list of 8 fields")
        rank, local_rank, pid, code, error_file, host, message, when = record
        if not all(type(v) is int for v in (rank, local_rank, pid)) \
                or not (code is None or type(code) is int) \
                or not all(v is None or type(v) is str for v in (error_file, host, message, when)):
            raise ValueError("a failure record has fields of the wrong types")
        return cls(rank, local_rank, pid, code, error_file, host, message or "", when)


def _error_file_message(path):
    """The message a worker's ``@record`` (PyTorch's error handler) wrote, if any."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        message = data.get("message", data)
        if isinstance(message, dict):
            return str(message.get("extraInfo", {}).get("py_callstack")
                       or message.get("message", ""))
        return str(message)
    except (OSError, ValueError, AttributeError):
        return None


def _format_failure(index, f):
    if f.exitcode is None:
        exit_text = f"<N/A> (pid: {f.pid}) its host was lost"
    elif f.exitcode < 0:
        try:
            exit_text = f"{f.exitcode} (pid: {f.pid}) {signal.Signals(-f.exitcode).name}"
        except ValueError:
            exit_text = f"{f.exitcode} (pid: {f.pid})"
    else:
        exit_text = f"{f.exitcode} (pid: {f.pid})"
    written = bool(f.message)
    trace = f.message if written else \
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    return "\n".join([f"[{index}]:", f"  time      : {f.time}",
                      f"  host      : {f.host}",
                      f"  rank      : {f.rank} (local_rank: {f.local_rank})",
                      f"  exitcode  : {exit_text}",
                      f"  error_file: {f.error_file if written and f.error_file else '<N/A>'}",
                      f"  traceback : {trace}"])


def assign_ranks(nodes, group_rank):
    """torchrun's ranks for the workers of node ``group_rank`` of ``nodes`` ([(role,
    local world size)] by group rank): (first global rank, world size, first role rank,
    role world size). The ranks of a node follow those of the nodes before it, so
    nodes may run different numbers of workers (and roles)."""
    role = nodes[group_rank][0]
    base = sum(n for _, n in nodes[:group_rank])
    role_base = sum(n for r, n in nodes[:group_rank] if r == role)
    return base, sum(n for _, n in nodes), role_base, sum(n for r, n in nodes if r == role)


def command(args, local_rank):
    """The command of the worker of ``local_rank``. The legacy launcher (``launch.py``,
    ``use_env`` False) passes ``--local-rank=<local rank>`` before the script's arguments,
    as torchrun's ``config_from_args`` does."""
    if args.no_python:
        argv = [args.training_script]
    else:
        argv = [os.environ.get("PYTHON_EXEC", sys.executable), "-u"] + \
            (["-m"] if args.module else []) + [args.training_script]
    if not getattr(args, "use_env", True):
        argv.append(f"--local-rank={local_rank}")
    return argv + list(args.training_script_args)


def _die_with_agent(agent_pid):
    def preexec():
        if sys.platform.startswith("linux"):
            try:
                ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            except (OSError, AttributeError):
                pass
        if os.getppid() != agent_pid:
            os._exit(1)
    return preexec


class WorkerGroup:
    """This node's workers of one round (``rnd``: a rendezvous round, see
    ``elastic/rendezvous``): started together, watched, stopped together."""

    def __init__(self, args, nproc, rnd, master, error_dir, secret, host):
        """``rnd``: its ``nodes`` (with ``role`` and ``nproc``) in group-rank order, this
        node's ``group_rank``, ``restarts``, ``round`` and ``run_id``; ``master``: the
        workers' (MASTER_ADDR, MASTER_PORT); ``host``: this host, named in failures."""
        self.procs, self.error_files, self.host = [], [], host
        base = dict(os.environ)
        if secret is not None:
            base["DISTGRAD_WORLD_SECRET"] = secret
        first, world, role_first, role_world = assign_ranks(
            [(n.role, n.nproc) for n in rnd.nodes], rnd.group_rank)
        self.first_rank = first
        addr, port = master
        for local_rank in range(nproc):
            error_file = os.path.join(error_dir, f"attempt_{rnd.restarts}_{rnd.round}",
                                      str(local_rank), "error.json")
            os.makedirs(os.path.dirname(error_file), exist_ok=True)
            env = dict(base)
            env.update({
                "LOCAL_RANK": "0" if args.virtual_local_rank else str(local_rank),
                "RANK": str(first + local_rank), "GROUP_RANK": str(rnd.group_rank),
                "ROLE_RANK": str(role_first + local_rank), "ROLE_NAME": args.role,
                "LOCAL_WORLD_SIZE": str(nproc), "WORLD_SIZE": str(world),
                "GROUP_WORLD_SIZE": str(len(rnd.nodes)), "ROLE_WORLD_SIZE": str(role_world),
                "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                "TORCHELASTIC_RESTART_COUNT": str(rnd.restarts),
                "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
                "TORCHELASTIC_RUN_ID": rnd.run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
                "TORCHELASTIC_ERROR_FILE": error_file,
            })
            self.error_files.append(error_file)
            try:
                self.procs.append(subprocess.Popen(command(args, local_rank), env=env,
                                                   start_new_session=True,
                                                   preexec_fn=_die_with_agent(os.getpid())))
            except BaseException:
                self.stop(signal.SIGTERM, 0.0)
                raise

    def poll(self):
        """(all exited successfully, [Failure in the order found])."""
        failures = []
        for local_rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and code != 0:
                failures.append(Failure(self.first_rank + local_rank, local_rank, proc.pid,
                                        code, self.error_files[local_rank], self.host))
        done = all(p.poll() == 0 for p in self.procs)
        return done, failures

    def stop(self, sig, grace):
        """Send ``sig`` to every live worker's session, SIGKILL after ``grace`` s, reap."""
        for proc in self.procs:
            if proc.poll() is None:
                _signal_session(proc, sig)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # killed below
                pass
        for proc in self.procs:
            if proc.poll() is None:
                _signal_session(proc, signal.SIGKILL)
            proc.wait()


def _signal_session(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
