"""``torchrun``: ``python -m distgrad.distributed.run`` (and, under
``python -m distgrad.compat.as_torch``, ``python -m torch.distributed.run`` or the
``torchrun`` script itself), on one node or several.

::

    python -m distgrad.distributed.run --nproc-per-node 2 train.py --epochs 3
    python -m distgrad.distributed.run --standalone --nproc-per-node 4 -m mypkg.train
    # on each of 2 hosts (R = 0, 1): the static rendezvous at host0's --master-port
    python -m distgrad.distributed.run --nnodes 2 --node-rank R --nproc-per-node 2 \
        --master-addr host0 --master-port 29500 train.py
    # elastic: 2 to 3 nodes, a lost one restarts the world with the rest
    python -m distgrad.distributed.run --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 \
        --rdzv-backend c10d --rdzv-endpoint host0:29400 --rdzv-id job7 train.py

Each agent starts ``--nproc-per-node`` copies of the training script (``python -u
SCRIPT``, ``python -u -m MODULE`` with ``-m``, or the command itself with
``--no-python``), each with the environment torchrun gives its workers: ``RANK``
(the ranks of a node follow those of the nodes before it, so nodes may run different
numbers of workers), ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``,
``GROUP_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_RESTART_COUNT``/``TORCHELASTIC_MAX_RESTARTS``,
``TORCHELASTIC_ERROR_FILE``, ``OMP_NUM_THREADS=1`` unless set (with torchrun's
warning), and ``DISTGRAD_WORLD_SECRET``. The arguments are torchrun's, with its
``PET_*`` environment fallbacks.

One node (``--nnodes 1``): the workers meet at ``--master-addr``/``--master-port``
(29500), the ``--rdzv-endpoint`` with ``--rdzv-backend=c10d``, or a free port with
``--standalone``; the agent makes the world secret unless it has one (kept across
restarts).

Several nodes: the agents meet first, in a store (``distgrad.distributed.TCPStore``)
that one of them serves: node 0's at ``--master-addr:--master-port`` with the static
rendezvous (every node gives ``--node-rank``; the world forms when all ``--nnodes``
joined), the agent on the ``--rdzv-endpoint``'s host with ``--rdzv-backend c10d``
(``--nnodes MIN:MAX``: the world forms with MAX nodes, or with MIN and no newcomer for
``last_call_timeout``; a node that comes later makes the running world start again with
it, as torchrun's ``num_nodes_waiting``). Each round's group rank 0 picks the workers'
``MASTER_PORT`` on its host (``MASTER_ADDR``: ``--master-addr`` when static, else that
host's address), and the workers meet on a store of their own
(``TORCHELASTIC_USE_AGENT_STORE=False``, as torchrun's with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``): the agents' store speaks distgrad's
protocol, not c10d's, so torchrun's ``MASTER_PORT`` (the agents' store) is not handed on.
The world secret is not made here: give every host the same ``DISTGRAD_WORLD_SECRET``,
or ``DISTGRAD_WORLD_SECRET_FILE`` (a file only its owner can read). With it the agents'
store is authenticated and encrypted (CURVE keys derived from it; the secret never
crosses the wire) and the workers get it; an agent with another secret is refused,
naming the store's host. Without one the launch works and warns once (the warning of
a world without a secret; ``DISTGRAD_REQUIRE_SECRET=1`` makes it an error).

It watches the workers, and with several nodes the other nodes (heartbeats in the
store): when a worker fails on any node, or a node's agent stops heartbeating (its
host is lost: ``keep_alive_interval`` x ``keep_alive_max_attempt``, 5 s x 3), every
agent stops its workers (the signal torchrun sends, SIGTERM, then SIGKILL after
``--shutdown-timeout``, 30 s) and the world starts again while ``--max-restarts``
allow, all agents agreeing on ``TORCHELASTIC_RESTART_COUNT`` (the count lives in the
store). A static world waits for a lost node to come back (the ``timeout`` of
``--rdzv-conf``, 600 s); an elastic one goes on with the nodes left if they are at
least MIN, and otherwise fails after ``join_timeout`` with
:class:`RendezvousTimeoutError` naming the nodes lost. The last failure is raised as
:class:`ChildFailedError` (exit status 1) with torchrun's report, on every node, with
the failure that ended the world first. A signal to an agent (SIGINT, SIGTERM, ...)
goes to its workers the same way and ends the round for the other nodes. Workers die
with their agent, also when it is killed. Bad input is refused naming the node, host
and address: nodes that disagree on ``--nnodes`` or ``--max-restarts``, two agents
with one ``--node-rank``, a rendezvous host that does not resolve or where nothing
answers within the rendezvous timeout.

What it does not do, and says so when asked: ``--run-path``, log redirection
(``--redirects``, ``--tee``, ``--local-ranks-filter``, duplicate filters), custom log
specs, NUMA binding, event log handlers other than ``null``, rendezvous backends other
than ``static`` and ``c10d`` (etcd), a file store for ``c10d``, a health-check server
or watchdog timers. The agent that serves the store is the job's: when its host is
lost the others fail, naming it (as torchrun's).
"""
import argparse
import os
import signal
import sys
import uuid

from ..rpc.credentials import member_secret, warn_open_world
from ..utils import addresses, world_secret
from ..utils.ports import free_port
from ..utils.tempdirs import owned_tempdir, remove_path
from .elastic.agent import run_agent
from .elastic.rendezvous.api import RendezvousError
from .elastic.rendezvous.handler import Rendezvous, Settings
from .elastic.rendezvous.local import LocalRendezvous
from .elastic.rendezvous.rendezvous_store import parse_endpoint
from .elastic.workers import ChildFailedError, SignalException

__all__ = ["main", "run", "get_args_parser", "parse_args", "ChildFailedError",
           "SignalException"]

_DEFAULT_SHUTDOWN_TIMEOUT = 30.0
_C10D_PORT = 29400     # torchrun's default port of a c10d endpoint


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
                                            "(distgrad)")
    p.add_argument("--nnodes", action=_Env, type=str, default="1:1",
                   help="Number of nodes, or the range of nodes in form "
                        "<minimum_nodes>:<maximum_nodes>.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", action=_Env, type=str, default="1",
                   help="Number of workers per node; supported values: [auto, cpu, int].")
    p.add_argument("--rdzv-backend", "--rdzv_backend", action=_Env, type=str,
                   default="static", help="Rendezvous backend (static or c10d).")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", action=_Env, type=str, default="",
                   help="Rendezvous backend endpoint; usually in form <host>:<port>.")
    p.add_argument("--rdzv-id", "--rdzv_id", action=_Env, type=str, default="none",
                   help="User-defined group id.")
    p.add_argument("--rdzv-conf", "--rdzv_conf", action=_Env, type=str, default="",
                   help="Additional rendezvous configuration (<key1>=<value1>,...): "
                        "timeout (static), join_timeout, last_call_timeout, close_timeout, "
                        "keep_alive_interval, keep_alive_max_attempt, read_timeout, is_host.")
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
                   help="Rank of the node for multi-node distributed training (static).")
    p.add_argument("--master-addr", "--master_addr", default="127.0.0.1", type=str,
                   action=_Env, help="Address of the master node (static rendezvous).")
    p.add_argument("--master-port", "--master_port", default=None, type=int, action=_Env,
                   help="Port on the master node (static rendezvous); defaults to 29500.")
    p.add_argument("--local-addr", "--local_addr", default=None, type=str, action=_Env,
                   help="Address of the local node: what the other nodes reach it at (default: "
                        "its address toward the rendezvous host).")
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


def _nnodes(text):
    """(min, max) of ``--nnodes`` (``N`` or ``MIN:MAX``)."""
    nodes = text.split(":")
    try:
        min_nodes, max_nodes = int(nodes[0]), int(nodes[-1])
    except ValueError:
        raise ValueError(f'--nnodes={text} is not in "MIN:MAX" format') from None
    if len(nodes) > 2:
        raise ValueError(f'--nnodes={text} is not in "MIN:MAX" format')
    if not 0 < min_nodes <= max_nodes:
        raise ValueError(f"--nnodes={text}: min_nodes must be > 0 and <= max_nodes")
    return min_nodes, max_nodes


def _unsupported(args):
    """The first option asking for what this launcher does not do, with why; None if all
    is supported."""
    min_nodes, max_nodes = _nnodes(args.nnodes)
    several = max_nodes > 1
    checks = [
        (args.rdzv_backend not in ("static", "c10d"),
         f"--rdzv-backend={args.rdzv_backend}: distgrad's agents meet with 'static' or 'c10d'"),
        (several and args.standalone, "--standalone runs one node; for several, give "
                                      "--rdzv-backend c10d --rdzv-endpoint HOST:PORT"),
        (not several and args.node_rank != 0,
         f"--node-rank={args.node_rank}: with --nnodes {args.nnodes} there is one node, rank 0"),
        (several and args.rdzv_backend == "static" and not 0 <= args.node_rank < max_nodes,
         f"--node-rank={args.node_rank} is out of range for --nnodes {args.nnodes} "
         f"(0..{max_nodes - 1})"),
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
    """(MASTER_ADDR, MASTER_PORT, run id) of a one-node launch."""
    if args.standalone:
        return "127.0.0.1", free_port("127.0.0.1"), str(uuid.uuid4())
    if args.rdzv_backend == "c10d" and args.rdzv_endpoint:
        host, port = parse_endpoint(args.rdzv_endpoint, _C10D_PORT)
        if host in ("localhost", ""):
            host = "127.0.0.1"
        return host, port or free_port(host), args.rdzv_id
    if args.rdzv_endpoint:
        host, port = parse_endpoint(args.rdzv_endpoint, args.master_port or 29500)
        return host, port, args.rdzv_id
    return args.master_addr, args.master_port or 29500, args.rdzv_id


def _rendezvous_conf(text):
    """``key=value,...`` of ``--rdzv-conf`` (torchrun's format and errors)."""
    conf = {}
    for item in filter(None, (kv.strip() for kv in text.strip().split(","))):
        key, _, value = item.partition("=")
        if not key.strip():
            raise ValueError("The rendezvous configuration string must be in format "
                             "<key1>=<value1>,...,<keyN>=<valueN>.")
        if not value.strip():
            raise ValueError(f"The rendezvous configuration option '{key.strip()}' must have "
                             "a value specified.")
        conf[key.strip()] = value.strip()
    return conf


def _settings(args, min_nodes, max_nodes):
    conf = _rendezvous_conf(args.rdzv_conf)
    if args.rdzv_backend == "static":
        endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port or 29500}"
        host, port = parse_endpoint(endpoint, -1)
        if port == -1:
            raise ValueError(f"Port is absent in endpoint: {endpoint}. Try launching with "
                             "--master-port")
        return Settings("static", max_nodes, max_nodes, args.node_rank, args.rdzv_id,
                        (host, port), args.max_restarts, conf, master_addr=host)
    if args.node_rank != 0:
        _log(f"node_rank is only used for static rdzv_backend. It will be ignored for "
             f"rdzv_backend={args.rdzv_backend}.")
    return Settings("c10d", min_nodes, max_nodes, -1, args.rdzv_id,
                    parse_endpoint(args.rdzv_endpoint, _C10D_PORT), args.max_restarts, conf)


class _AgentOptions:
    """What ``member_secret`` asks of options (an agent has no RPC options)."""
    world_secret = None
    mechanism = "plain"


def _shared_secret(args, world_nodes):
    """The world secret every node's agent must have been given (text), or None (an error
    under DISTGRAD_REQUIRE_SECRET=1; the agent that serves the store warns:
    :func:`_warn_if_open`)."""
    secret = world_secret.current()
    if secret is None:
        member_secret(_AgentOptions, f"the torchrun agent of node rank {args.node_rank}"
                      if args.rdzv_backend == "static" else "this torchrun agent",
                      world_nodes, error=RendezvousError)
    return secret


def _warn_if_open(rendezvous, secret, world_nodes):
    """Without a secret, the agent that serves the rendezvous store says so, once for the
    job (not every node's agent), unless the store is on this host's loopback."""
    if secret is None and rendezvous.served:
        s = rendezvous.settings
        who = (f"the torchrun agent of node rank {s.node_rank}" if s.backend == "static"
               else "the torchrun agent that serves the rendezvous store")
        warn_open_world(who, world_nodes, addresses.endpoint(s.host, s.port), (),
                        _AgentOptions.mechanism)


def _shutdown_timeout(args):
    if args.shutdown_timeout is not None:
        return float(args.shutdown_timeout)
    return float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", _DEFAULT_SHUTDOWN_TIMEOUT))


def _log(message):
    print(f"distgrad.distributed.run: {message}", file=sys.stderr, flush=True)


def run(args):
    """Launch and watch this node's workers of ``args`` (a parsed command line); raises
    :class:`ChildFailedError` when they fail for good."""
    why = _unsupported(args)
    if why is not None:
        raise ValueError(f"distgrad.distributed.run: {why}")
    min_nodes, max_nodes = _nnodes(args.nnodes)
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
    grace = _shutdown_timeout(args)
    handled = [getattr(signal, name.strip()) for name in args.signals_to_handle.split(",")
               if name.strip() and hasattr(signal, name.strip())]

    def on_signal(signum, frame):
        raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signum)

    if max_nodes == 1:
        master = _meeting_point(args)
        run_id = master[2]
    else:
        settings = _settings(args, min_nodes, max_nodes)
        run_id = args.rdzv_id
    previous = {s: signal.signal(s, on_signal) for s in handled}
    error_dir = None
    try:
        if args.log_dir:  # kept, as torchrun keeps its log directory
            error_dir = os.path.join(args.log_dir, f"{run_id}_{uuid.uuid4().hex[:8]}")
            os.makedirs(error_dir)
        else:             # removed at the end, or swept if this process is killed
            error_dir = owned_tempdir("distgrad-torchrun-")
        if max_nodes == 1:
            secret = world_secret.for_children()  # one per launch: its restarts keep it
            rendezvous = LocalRendezvous(master[:2], run_id, nproc, args.role,
                                         args.max_restarts)
        else:
            secret = _shared_secret(args, max_nodes)
            rendezvous = Rendezvous(settings, nproc, args.role, secret, args.local_addr)
            _warn_if_open(rendezvous, secret, max_nodes)
        run_agent(args, rendezvous, nproc, error_dir, secret, grace)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if error_dir is not None and not args.log_dir:
            remove_path(error_dir)


def main(args=None):
    """``torchrun``'s entry point."""
    run(parse_args(args))


if __name__ == "__main__":
    main()
