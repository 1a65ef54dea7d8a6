"""``torchrun`` on one machine: ``python -m distgrad.distributed.run`` (and, under
``python -m distgrad.compat.as_torch``, ``python -m torch.distributed.run`` or the
``torchrun`` script itself).

::

    python -m distgrad.distributed.run --nproc-per-node 2 train.py --epochs 3
    python -m distgrad.distributed.run --standalone --nproc-per-node 4 -m mypkg.train
    python -m distgrad.distributed.run --nproc-per-node 2 --max-restarts 3 train.py

It starts ``--nproc-per-node`` copies of the training script (``python -u
SCRIPT``, ``python -u -m MODULE`` with ``-m``, or the command itself with
``--no-python``), each with the environment torchrun gives its workers:
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``GROUP_WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_RESTART_COUNT``/``TORCHELASTIC_MAX_RESTARTS``,
``TORCHELASTIC_ERROR_FILE``, ``OMP_NUM_THREADS=1`` unless set (with
torchrun's warning), and ``DISTGRAD_WORLD_SECRET``: the world's secret, made by the
agent unless it has one (kept across restarts), so the world admits only its workers. The arguments are torchrun's, with its ``PET_*``
environment fallbacks.

Where it meets: ``--master-addr``/``--master-port`` (29500) with the default
static rendezvous, the ``--rdzv-endpoint`` with ``--rdzv-backend=c10d``, a free
port with ``--standalone`` (or an endpoint port of 0). This agent keeps no store
of its own (``TORCHELASTIC_USE_AGENT_STORE=False``): rank 0 serves the store at
``MASTER_PORT``, as under PyTorch's ``torch.distributed.launch``.

It watches the workers: when one fails, the others get the signal torchrun
sends (SIGTERM), then SIGKILL after ``--shutdown-timeout`` (30 s), and the whole
group starts again while ``--max-restarts`` allow (``TORCHELASTIC_RESTART_COUNT``
counts the attempts). The last failure is raised as :class:`ChildFailedError`
(exit status 1) with torchrun's report. A signal to the agent (SIGINT, SIGTERM,
...) goes to the workers the same way. Workers die with the agent, also when it
is killed.

What it does not do, and says so when asked: more than one node (start one
``distgrad`` process group per machine with ``init_method`` instead, or use
PyTorch's torchrun), ``--run-path``, log redirection (``--redirects``,
``--tee``, ``--local-ranks-filter``, duplicate filters), custom log specs, NUMA
binding, event log handlers other than ``null``, elastic membership changes.
"""
import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime

from ..utils.ports import free_port
from ..utils.tempdirs import owned_tempdir, remove_path
from ..utils.world_secret import SECRET_ENV, for_children

__all__ = ["main", "run", "get_args_parser", "parse_args", "ChildFailedError",
           "SignalException"]

_DEFAULT_SHUTDOWN_TIMEOUT = 30.0
_PR_SET_PDEATHSIG = 1


class ChildFailedError(Exception):
    """A worker failed after every allowed restart (torchrun's exception of that name)."""

    def __init__(self, name, failures):
        self.name = name
        self.failures = failures  # [_Failure], the first observed first
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


class _Failure:
    def __init__(self, rank, local_rank, pid, exitcode, error_file):
        self.rank, self.local_rank, self.pid = rank, local_rank, pid
        self.exitcode, self.error_file = exitcode, error_file
        self.time = datetime.now().strftime("%Y-%m-%d_%H:%M:%S")
        self.message = _error_file_message(error_file)


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
    if f.exitcode < 0:
        try:
            exit_text = f"{f.exitcode} (pid: {f.pid}) {signal.Signals(-f.exitcode).name}"
        except ValueError:
            exit_text = f"{f.exitcode} (pid: {f.pid})"
    else:
        exit_text = f"{f.exitcode} (pid: {f.pid})"
    written = f.message is not None
    trace = f.message if written else \
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
    return "\n".join([f"[{index}]:", f"  time      : {f.time}",
                      f"  host      : {socket.getfqdn()}",
                      f"  rank      : {f.rank} (local_rank: {f.local_rank})",
                      f"  exitcode  : {exit_text}",
                      f"  error_file: {f.error_file if written else '<N/A>'}",
                      f"  traceback : {trace}"])


# ---------------------------------------------------------------------- arguments
class _Env(argparse.Action):
    """torchrun's ``env`` action: the default comes from ``PET_<NAME>`` when it is set."""

    def __init__(self, dest, default=None, required=False, **kwargs):
        env_name = f"PET_{dest.upper()}"
        default = os.environ.get(env_name, default)
        if default:
            required = False
        super().__init__(dest=dest, default=default, required=required, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """torchrun's ``check_env`` flag: ``PET_<NAME>=1`` turns it on."""

    def __init__(self, dest, default=False, **kwargs):
        default = bool(int(os.environ.get(f"PET_{dest.upper()}", "1" if default else "0")))
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const)


def get_args_parser():
    """torchrun's command line (same names, defaults and ``PET_*`` fallbacks)."""
    p = argparse.ArgumentParser(description="Torch Distributed Elastic Training Launcher "
                                            "(distgrad: one node)")
    p.add_argument("--nnodes", action=_Env, type=str, default="1:1",
                   help="Number of nodes, or the range of nodes in form "
                        "<minimum_nodes>:<maximum_nodes>; distgrad runs one.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", action=_Env, type=str, default="1",
                   help="Number of workers per node; supported values: [auto, cpu, int].")
    p.add_argument("--rdzv-backend", "--rdzv_backend", action=_Env, type=str,
                   default="static", help="Rendezvous backend (static or c10d).")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", action=_Env, type=str, default="",
                   help="Rendezvous backend endpoint; usually in form <host>:<port>.")
    p.add_argument("--rdzv-id", "--rdzv_id", action=_Env, type=str, default="none",
                   help="User-defined group id.")
    p.add_argument("--rdzv-conf", "--rdzv_conf", action=_Env, type=str, default="",
                   help="Additional rendezvous configuration (<key1>=<value1>,...); one "
                        "node needs none of it.")
    p.add_argument("--standalone", action=_CheckEnv,
                   help="Meet on a free port of this machine (rdzv settings are ignored).")
    p.add_argument("--max-restarts", "--max_restarts", action=_Env, type=int, default=0,
                   help="Maximum number of worker group restarts before failing.")
    p.add_argument("--monitor-interval", "--monitor_interval", action=_Env, type=float,
                   default=0.1, help="Interval, in seconds, to monitor the state of workers.")
    p.add_argument("--start-method", "--start_method", action=_Env, type=str, default="spawn",
                   choices=["spawn", "fork", "forkserver"],
                   help="Multiprocessing start method (scripts always run as processes).")
    p.add_argument("--event-log-handler", "--event_log_handler", action=_Env, type=str,
                   default="null", help="Only 'null' in distgrad.")
    p.add_argument("--role", action=_Env, type=str, default="default",
                   help="User-defined role for the workers.")
    p.add_argument("-m", "--module", action=_CheckEnv,
                   help="Run the script as a module, as 'python -m'.")
    p.add_argument("--no-python", "--no_python", action=_CheckEnv,
                   help="Run the training script itself, not with 'python'.")
    p.add_argument("--run-path", "--run_path", action=_CheckEnv,
                   help="Not supported by distgrad (run the script as a process).")
    p.add_argument("--log-dir", "--log_dir", action=_Env, type=str, default=None,
                   help="Base directory for the workers' error files.")
    p.add_argument("-r", "--redirects", action=_Env, type=str, default="0",
                   help="Not supported by distgrad (only 0).")
    p.add_argument("-t", "--tee", action=_Env, type=str, default="0",
                   help="Not supported by distgrad (only 0).")
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", action=_Env, type=str,
                   default="", help="Not supported by distgrad.")
    p.add_argument("--duplicate-stdout-filters", "--duplicate_stdout_filters", action=_Env,
                   type=str, default="", help="Not supported by distgrad.")
    p.add_argument("--duplicate-stderr-filters", "--duplicate_stderr_filters", action=_Env,
                   type=str, default="", help="Not supported by distgrad.")
    p.add_argument("--node-rank", "--node_rank", type=int, action=_Env, default=0,
                   help="Rank of the node (0: distgrad runs one).")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", type=str,
                   action=_Env, help="Address of the master node (static rendezvous).")
    p.add_argument("--master-port", "--master_port", default=None, type=int, action=_Env,
                   help="Port on the master node (static rendezvous); defaults to 29500.")
    p.add_argument("--local-addr", "--local_addr", default=None, type=str, action=_Env,
                   help="Address of the local node (unused on one node).")
    p.add_argument("--logs-specs", "--logs_specs", default=None, type=str,
                   help="Not supported by distgrad.")
    p.add_argument("--numa-binding", "--numa_binding", type=str, default=None,
                   help="Not supported by distgrad.")
    p.add_argument("--signals-to-handle", "--signals_to_handle", action=_Env, type=str,
                   default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                   help="Signals forwarded to the workers.")
    p.add_argument("--shutdown-timeout", "--shutdown_timeout", action=_Env, type=int,
                   default=None, help="Seconds between the signal and SIGKILL when stopping "
                                      "workers (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30).")
    p.add_argument("--virtual-local-rank", "--virtual_local_rank", action=_CheckEnv,
                   help="LOCAL_RANK=0 in every worker.")
    p.add_argument("training_script", type=str,
                   help="The training program/script to be launched in parallel, followed "
                        "by all the arguments for the training script.")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def parse_args(args):
    return get_args_parser().parse_args(args)


def _unsupported(args):
    """The first option asking for what this launcher does not do, with why; None if all
    is supported."""
    nodes = args.nnodes.split(":")
    try:
        max_nodes = int(nodes[-1])
        min_nodes = int(nodes[0])
    except ValueError:
        return f'--nnodes={args.nnodes} is not in "MIN:MAX" format'
    if len(nodes) > 2 or not 0 < min_nodes <= max_nodes:
        return f"--nnodes={args.nnodes}: min_nodes must be > 0 and <= max_nodes"
    if max_nodes != 1:
        return (f"--nnodes={args.nnodes}: distgrad.distributed.run starts the workers of one "
                "node; for several machines give each process RANK/WORLD_SIZE and a shared "
                "init_method (or use PyTorch's torchrun)")
    checks = [
        (args.node_rank != 0, f"--node-rank={args.node_rank}: there is one node, rank 0"),
        (args.rdzv_backend not in ("static", "c10d"),
         f"--rdzv-backend={args.rdzv_backend}: one node meets with 'static' or 'c10d'"),
        (args.run_path, "--run-path: run the script as a process (drop --run-path)"),
        (args.redirects != "0" or args.tee != "0",
         "--redirects/--tee: the workers write to this process's stdout and stderr"),
        (bool(args.local_ranks_filter), "--local-ranks-filter"),
        (bool(args.duplicate_stdout_filters or args.duplicate_stderr_filters),
         "--duplicate-stdout-filters/--duplicate-stderr-filters"),
        (args.logs_specs is not None, "--logs-specs"),
        (args.numa_binding is not None, "--numa-binding"),
        (args.event_log_handler != "null", f"--event-log-handler={args.event_log_handler}"),
        (args.max_restarts < 0, "--max-restarts must be >= 0"),
        (args.module and args.no_python,
         "Don't use both the '--no-python' flag and the '--module' flag at the same time."),
    ]
    for bad, why in checks:
        if bad:
            return why
    return None


def _local_world_size(nproc_per_node):
    try:
        return int(nproc_per_node)
    except ValueError:
        if nproc_per_node in ("cpu", "auto"):
            return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
                else (os.cpu_count() or 1)
        if nproc_per_node == "gpu":
            raise ValueError("Cuda is not available.") from None
        if nproc_per_node == "xpu":
            raise ValueError("Xpu is not available.") from None
        raise ValueError(f"Unsupported nproc_per_node value: {nproc_per_node}") from None


def _meeting_point(args):
    """(MASTER_ADDR, MASTER_PORT, run id) of this launch."""
    if args.standalone:
        return "127.0.0.1", free_port("127.0.0.1"), str(uuid.uuid4())
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":")
        if not host:
            host, port = args.rdzv_endpoint, "29400"  # torchrun's c10d default port
        host = host.strip("[]")
        port = int(port)
        if host in ("localhost", ""):
            host = "127.0.0.1"
        return host, port or free_port(host), args.rdzv_id
    if args.rdzv_endpoint:
        host, _, port = args.rdzv_endpoint.rpartition(":")
        return host.strip("[]"), int(port), args.rdzv_id
    return args.master_addr, args.master_port or 29500, args.rdzv_id


def _command(args, local_rank):
    """The command of the worker of ``local_rank``. The legacy launcher (``launch.py``,
    ``use_env`` False) passes ``--local-rank=<local rank>`` before the script's arguments,
    as torchrun's ``config_from_args`` does."""
    if args.no_python:
        command = [args.training_script]
    else:
        command = [os.environ.get("PYTHON_EXEC", sys.executable), "-u"] + \
            (["-m"] if args.module else []) + [args.training_script]
    if not getattr(args, "use_env", True):
        command.append(f"--local-rank={local_rank}")
    return command + list(args.training_script_args)


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


class _Group:
    """The workers of one attempt: started together, watched, stopped together."""

    def __init__(self, args, nproc, addr, port, run_id, attempt, error_dir, secret):
        self.procs, self.error_files = [], []
        base = dict(os.environ)
        if secret is not None:
            base[SECRET_ENV] = secret
        for local_rank in range(nproc):
            error_file = os.path.join(error_dir, f"attempt_{attempt}", str(local_rank),
                                      "error.json")
            os.makedirs(os.path.dirname(error_file), exist_ok=True)
            env = dict(base)
            env.update({
                "LOCAL_RANK": "0" if args.virtual_local_rank else str(local_rank),
                "RANK": str(local_rank), "GROUP_RANK": "0", "ROLE_RANK": str(local_rank),
                "ROLE_NAME": args.role, "LOCAL_WORLD_SIZE": str(nproc),
                "WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
                "ROLE_WORLD_SIZE": str(nproc), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                "TORCHELASTIC_RESTART_COUNT": str(attempt),
                "TORCHELASTIC_MAX_RESTARTS": str(args.max_restarts),
                "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_USE_AGENT_STORE": "False",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
                "TORCHELASTIC_ERROR_FILE": error_file,
            })
            self.error_files.append(error_file)
            try:
                self.procs.append(subprocess.Popen(_command(args, local_rank), env=env,
                                                   start_new_session=True,
                                                   preexec_fn=_die_with_agent(os.getpid())))
            except BaseException:
                self.stop(signal.SIGTERM, 0.0)
                raise

    def poll(self):
        """(all exited successfully, [failures in the order found])."""
        failures = []
        for local_rank, proc in enumerate(self.procs):
            code = proc.poll()
            if code is not None and code != 0:
                failures.append(_Failure(local_rank, local_rank, proc.pid, code,
                                         self.error_files[local_rank]))
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


def _shutdown_timeout(args):
    if args.shutdown_timeout is not None:
        return float(args.shutdown_timeout)
    return float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", _DEFAULT_SHUTDOWN_TIMEOUT))


def _log(message):
    print(f"distgrad.distributed.run: {message}", file=sys.stderr, flush=True)


def run(args):
    """Launch and watch the workers of ``args`` (a parsed command line); raises
    :class:`ChildFailedError` when they fail for good."""
    why = _unsupported(args)
    if why is not None:
        raise ValueError(f"distgrad.distributed.run: {why}")
    nproc = _local_world_size(args.nproc_per_node)
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, not {nproc}")
    if "OMP_NUM_THREADS" not in os.environ and nproc > 1:
        _log("\n*****************************************\n"
             "Setting OMP_NUM_THREADS environment variable for each process to be 1 in "
             "default, to avoid your system being overloaded, please further tune the "
             "variable for optimal performance in your application as needed. \n"
             "*****************************************")
        os.environ["OMP_NUM_THREADS"] = "1"
    addr, port, run_id = _meeting_point(args)
    secret = for_children()  # one per launch: its restarts keep it
    grace = _shutdown_timeout(args)
    handled = [getattr(signal, name.strip()) for name in args.signals_to_handle.split(",")
               if name.strip() and hasattr(signal, name.strip())]
    if args.log_dir:  # kept, as torchrun keeps its log directory
        error_dir = os.path.join(args.log_dir, f"{run_id}_{uuid.uuid4().hex[:8]}")
        os.makedirs(error_dir)
    else:             # removed at the end, or swept if this process is killed
        error_dir = owned_tempdir("distgrad-torchrun-")

    def on_signal(signum, frame):
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signum)

    previous = {s: signal.signal(s, on_signal) for s in handled}
    group = None
    try:
        for attempt in range(args.max_restarts + 1):
            group = _Group(args, nproc, addr, port, run_id, attempt, error_dir, secret)
            while True:
                done, failures = group.poll()
                if done:
                    return
                if failures:
                    break
                time.sleep(args.monitor_interval)
            group.stop(signal.SIGTERM, grace)
            left = args.max_restarts - attempt
            if left:
                _log(f"[{args.role}] worker group FAILED ({_describe(failures[0])}); "
                     f"{left}/{args.max_restarts} attempts left, restarting the worker group")
                continue
            raise ChildFailedError(os.path.basename(args.training_script), failures)
    except SignalException as e:
        if group is not None:
            group.stop(e.sigval, grace)
        raise
    except BaseException:
        if group is not None:
            group.stop(signal.SIGTERM, grace)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if not args.log_dir:
            remove_path(error_dir)


def _describe(failure):
    return f"local rank {failure.local_rank} exited with {failure.exitcode}"


def main(args=None):
    """``torchrun``'s entry point."""
    run(parse_args(args))


if __name__ == "__main__":
    main()
