"""A worker process: joins an RPC world and serves until the world shuts down.

    python -m distgrad worker --name worker1 --rank 1 --world-size 3 \\
        --master-addr 127.0.0.1 --master-port 29500

Every option falls back to an environment variable (shown in ``--help``), so
Slurm, ssh and Kubernetes launchers can start workers without flags. The
working directory is on the import path, as for ``python script.py``, so
``--allow mymodel`` finds ``mymodel.py`` next to where the worker starts.

A worker that seems to hang can be asked what it is doing: with
``--dump-signal USR1``, ``kill -USR1 <pid>`` prints every thread's stack and
the worker's pending calls to its stderr, and the worker goes on serving.
"""
import argparse
import logging
import os
import signal
import sys

from .utils import addresses
from .utils.cli import env, in_range
from .utils.processes import die_with_parent

__all__ = ["add_arguments", "run", "main", "DUMP_END"]

HELP = "run an RPC worker until the world shuts down"

#: The last line of what ``--dump-signal`` prints (a reader knows the dump is complete).
DUMP_END = "-- end of distgrad worker dump --"


def _link(text):
    """argparse type: a simulated link, '<latency> <bandwidth>' (checked, kept as text)."""
    from distgrad.rpc.link import parse_link  # lazily, as the module's other distgrad imports
    try:
        parse_link(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _switch(text):
    """argparse type: on/off (true/false, 1/0)."""
    if isinstance(text, bool):
        return text
    value = {"on": True, "true": True, "1": True, "yes": True,
             "off": False, "false": False, "0": False, "no": False}.get(str(text).lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not on or off")
    return value


def _cpus(text):
    """argparse type: a list of cores, '0-3,6' (see distgrad.utils.cpus)."""
    from distgrad.utils.cpus import parse_cpus
    if isinstance(text, list):
        return text
    try:
        return parse_cpus(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _signal_number(text):
    """argparse type: ``USR1``, ``SIGUSR1`` or a number."""
    name = text.upper()
    name = name if name.startswith("SIG") or name.isdigit() else "SIG" + name
    try:
        return signal.Signals(int(name)) if name.isdigit() else signal.Signals[name]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal name or number") from None


def add_arguments(p):
    p.add_argument("--name", default=env("WORKER_NAME") or env("NAME"),
                   help="this worker's name, unique in the world (env: WORKER_NAME or NAME)")
    p.add_argument("--rank", type=in_range(int, 0), default=env("RANK"),
                   help="this worker's rank, 0 <= rank < world size (env: RANK)")
    p.add_argument("--world-size", type=in_range(int, 1), default=env("WORLD_SIZE"),
                   help="number of processes in the world, the coordinator included "
                        "(env: WORLD_SIZE)")
    p.add_argument("--master-addr", default=env("MASTER_ADDR"),
                   help="host of the rendezvous, run by rank 0 (env: MASTER_ADDR)")
    p.add_argument("--master-port", type=in_range(int, 1, 65535, "port"),
                   default=env("MASTER_PORT"),
                   help="TCP port of the rendezvous, 1-65535 (env: MASTER_PORT)")
    p.add_argument("--init-method", default=env("DISTGRAD_COORDINATOR"),
                   help="tcp://host:port or ipc:///path of the rendezvous; overrides "
                        "--master-addr/--master-port (env: DISTGRAD_COORDINATOR)")
    p.add_argument("--transport", choices=("tcp", "ipc"), default=env("DISTGRAD_TRANSPORT", "tcp"),
                   help="this worker's own endpoint: tcp on --bind-addr, or an ipc socket "
                        "(default: %(default)s; env: DISTGRAD_TRANSPORT)")
    p.add_argument("--bind-addr", default=env("DISTGRAD_BIND_ADDR"),
                   help="address the tcp endpoint binds to (default: this host's address "
                        "toward the rendezvous host, 127.0.0.1 for one on loopback; env: "
                        "DISTGRAD_BIND_ADDR, or an interface: DISTGRAD_SOCKET_IFNAME)")
    p.add_argument("--allow", action="append", default=[], metavar="MODULE",
                   help="a module whose functions and classes may run here, with its "
                        "submodules; repeatable (env: DISTGRAD_ALLOWED_MODULES, "
                        "comma-separated)")
    p.add_argument("--authenticate", type=_switch, default=_switch(env("DISTGRAD_AUTHENTICATE", "on")),
                   metavar="on|off",
                   help="admit only the world's members, each as its own rank; the world's "
                        "secret comes from DISTGRAD_WORLD_SECRET (default: on; env: "
                        "DISTGRAD_AUTHENTICATE)")
    p.add_argument("--num-threads", type=in_range(int, 1), default=16,
                   help="handler threads kept ready (default: %(default)s)")
    p.add_argument("--rpc-timeout", type=in_range(float, 0.0), default=60.0, metavar="SECONDS",
                   help="default timeout of this worker's own calls, in seconds; 0 waits "
                        "forever (default: %(default)s)")
    p.add_argument("--rendezvous-timeout", type=in_range(float, 0.1), metavar="SECONDS",
                   default=float(env("DISTGRAD_RENDEZVOUS_TIMEOUT", 60.0)),
                   help="how long to wait for the whole world to join, in seconds "
                        "(default: %(default)s; env: DISTGRAD_RENDEZVOUS_TIMEOUT)")
    p.add_argument("--heartbeat-interval", type=in_range(float, 0.01), metavar="SECONDS",
                   default=float(env("DISTGRAD_HEARTBEAT_INTERVAL", 0.5)),
                   help="seconds between liveness heartbeats (default: %(default)s; env: "
                        "DISTGRAD_HEARTBEAT_INTERVAL)")
    p.add_argument("--heartbeat-timeout", type=in_range(float, 0.1), metavar="SECONDS",
                   default=float(env("DISTGRAD_HEARTBEAT_TIMEOUT", 3.0)),
                   help="how long a stopped or unreachable peer may stay silent before it is "
                        "reported dead (default: %(default)s; env: DISTGRAD_HEARTBEAT_TIMEOUT)")
    p.add_argument("--shm-threshold", type=in_range(int, 0), metavar="BYTES",
                   default=int(env("DISTGRAD_SHM_THRESHOLD", 1 << 20)),
                   help="arrays of at least this many bytes go to same-host peers through "
                        "shared memory; 0 turns that off (default: %(default)s; env: "
                        "DISTGRAD_SHM_THRESHOLD)")
    p.add_argument("--max-inflight", type=in_range(int, 1), metavar="CALLS",
                   default=int(env("DISTGRAD_MAX_INFLIGHT", 1024)),
                   help="calls to one worker in flight at once before another waits "
                        "(default: %(default)s; env: DISTGRAD_MAX_INFLIGHT)")
    p.add_argument("--max-message-size", type=in_range(int, 1024), metavar="BYTES",
                   default=int(env("DISTGRAD_MAX_MESSAGE_SIZE", 1 << 30)),
                   help="largest accepted message part; a peer sending more is disconnected "
                        "(default: %(default)s; env: DISTGRAD_MAX_MESSAGE_SIZE)")
    p.add_argument("--simulated-link", default=env("DISTGRAD_SIMULATED_LINK"),
                   metavar="LINK", type=_link,
                   help="hold messages from other processes as if they came over a link "
                        "of this latency and bandwidth, e.g. '200us 10Gbit/s' (measuring "
                        "on one machine what hosts would see; env: DISTGRAD_SIMULATED_LINK)")
    p.add_argument("--flush-denormal", action="store_true",
                   help="treat subnormal floats as zero in this process's threads "
                        "(torch.set_flush_denormal(True) before it joins the world)")
    p.add_argument("--cpus", type=_cpus, default=env("DISTGRAD_WORKER_CPUS"), metavar="LIST",
                   help="run on these cores only, e.g. '0-1,4' (pinned before any thread "
                        "starts; env: DISTGRAD_WORKER_CPUS)")
    p.add_argument("--dump-signal", type=_signal_number, default=env("DISTGRAD_DUMP_SIGNAL"),
                   metavar="SIGNAL",
                   help="on this signal (e.g. USR1), print every thread's stack and this "
                        "worker's pending calls to stderr and go on (env: DISTGRAD_DUMP_SIGNAL)")
    p.add_argument("--log-level", default=env("DISTGRAD_LOG_LEVEL", "INFO"),
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"), type=str.upper,
                   help="(default: %(default)s; env: DISTGRAD_LOG_LEVEL)")
    return p


def _dump_on(signum, name):
    """On ``signum``: every thread's stack (faulthandler, from the signal handler itself, so
    a thread stuck in C shows too), then this worker's pending calls and :data:`DUMP_END`
    (from the main thread, which runs Python handlers between its waits)."""
    import faulthandler

    def pending(_signum, _frame):
        import threading
        from distgrad.rpc import current_agent
        agent = current_agent()
        calls = agent.calls.describe() if agent is not None else "(not serving)"
        threads = ", ".join(f"0x{t.ident:016x} {t.name}" for t in threading.enumerate())
        sys.stderr.write(f"threads of {name}: {threads}\npending calls of {name}: "
                         f"{calls or 'none'}\n{DUMP_END}\n")
        sys.stderr.flush()
    signal.signal(signum, pending)
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=True)


def _check(args, parser):
    missing = [flag for flag, v in (("--name", args.name), ("--rank", args.rank),
                                    ("--world-size", args.world_size)) if v is None]
    if missing:
        parser.error(f"{', '.join(missing)} required (or the environment variables named in --help)")
    if args.rank >= args.world_size:
        parser.error(f"--rank {args.rank} is out of range for --world-size {args.world_size}")
    if args.init_method is None and (args.master_addr is None) != (args.master_port is None):
        parser.error("--master-addr and --master-port go together")


def run(args, parser=None):
    parser = parser or add_arguments(argparse.ArgumentParser(prog="distgrad worker"))
    _check(args, parser)
    if args.cpus is not None:
        from distgrad.utils.cpus import pin_to
        try:  # first: the threads RPC starts inherit the affinity of the thread starting them
            pin_to(args.cpus, f"worker {args.name}")
        except ValueError as e:
            parser.error(f"--cpus: {e}")
    if args.flush_denormal:  # before the RPC threads start: they inherit the setting
        from distgrad.flush_denormal import flush_or_raise
        try:
            flush_or_raise("--flush-denormal")
        except RuntimeError as e:
            parser.error(str(e))
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    if os.environ.get("DISTGRAD_PDEATHSIG"):
        die_with_parent()
    if args.dump_signal is not None:
        _dump_on(args.dump_signal, args.name)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python script.py` puts the script's folder first
    import distgrad.distributed  # noqa: F401 - what peers call here for distributed autograd,
    # RemoteModule and DistributedOptimizer registers with the allowlist
    from distgrad.rpc import api
    from distgrad.rpc.options import RpcBackendOptions
    init_method = args.init_method
    if init_method is None and args.master_addr:
        init_method = addresses.endpoint(args.master_addr, args.master_port)
    allowed = list(args.allow) + [m for m in env("DISTGRAD_ALLOWED_MODULES", "").split(",") if m]
    pub, sec = env("DISTGRAD_CURVE_PUBLIC_KEY"), env("DISTGRAD_CURVE_SECRET_KEY")
    log = logging.getLogger("distgrad.rpc")
    try:
        opts = RpcBackendOptions(
            init_method=init_method or "env://", transport=args.transport,
            bind_addr=args.bind_addr, allowed_modules=allowed, authenticate=args.authenticate,
            num_worker_threads=args.num_threads, rpc_timeout=args.rpc_timeout,
            rendezvous_timeout=args.rendezvous_timeout, heartbeat_interval=args.heartbeat_interval,
            heartbeat_timeout=args.heartbeat_timeout, shm_threshold=args.shm_threshold,
            simulated_link=args.simulated_link,
            max_inflight_per_worker=args.max_inflight, max_message_size=args.max_message_size,
            curve_public_key=pub.encode() if pub else None,
            curve_secret_key=sec.encode() if sec else None)
        api.init_rpc(args.name, rank=args.rank, world_size=args.world_size, rpc_backend_options=opts)
    except Exception as e:  # noqa: BLE001 - one line that says why, not a traceback
        log.error("could not join the world: %s", e)
        return 1
    log.info("serving as rank %d of %d", args.rank, args.world_size)
    try:
        api.shutdown(graceful=True)  # a barrier: returns once the whole world shuts down
    except Exception as e:  # noqa: BLE001 - e.g. the coordinator died: exit, don't hang
        log.error("shutdown failed: %s", e)
        return 1
    log.info("world shut down; exiting")
    return 0


def main(argv=None):
    parser = add_arguments(argparse.ArgumentParser(prog="distgrad worker", description=HELP))
    return run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())
