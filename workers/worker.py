"""A worker process: joins an RPC world and serves until the world shuts down.

    python -m workers.worker --name worker1 --rank 1 --world-size 3 \\
        --master-addr 127.0.0.1 --master-port 29500

Every option falls back to the environment (NAME/WORKER_NAME, RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, DISTGRAD_COORDINATOR, DISTGRAD_ALLOWED_MODULES as a
comma-separated list, DISTGRAD_CURVE_PUBLIC_KEY/DISTGRAD_CURVE_SECRET_KEY).
"""
import argparse
import logging
import os
import signal
import sys


def build_parser(parser=None):
    p = parser or argparse.ArgumentParser(prog="distgrad worker", description=__doc__.split("\n")[0])
    env = os.environ.get
    p.add_argument("--name", default=env("WORKER_NAME") or env("NAME"))
    p.add_argument("--rank", type=int, default=env("RANK"))
    p.add_argument("--world-size", type=int, default=env("WORLD_SIZE"))
    p.add_argument("--master-addr", default=env("MASTER_ADDR"))
    p.add_argument("--master-port", type=int, default=env("MASTER_PORT"))
    p.add_argument("--init-method", default=None,
                   help="tcp://host:port or ipc:///path of the rendezvous (overrides master-*)")
    p.add_argument("--transport", choices=("tcp", "ipc"), default=env("DISTGRAD_TRANSPORT", "tcp"))
    p.add_argument("--bind-addr", default=env("DISTGRAD_BIND_ADDR", "127.0.0.1"))
    p.add_argument("--allow", action="append", default=[],
                   help="a module whose callables may run here (repeatable)")
    p.add_argument("--num-threads", type=int, default=16)
    p.add_argument("--rpc-timeout", type=float, default=60.0)
    p.add_argument("--log-level", default=env("DISTGRAD_LOG_LEVEL", "INFO"))
    return p


def _die_with_parent():
    """Linux: get SIGKILL when the parent dies, so a crashed test leaves no orphan."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(1)
    except Exception:
        pass


def run(args):
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    if os.environ.get("DISTGRAD_PDEATHSIG"):
        _die_with_parent()
    if args.name is None or args.rank is None or args.world_size is None:
        raise SystemExit("distgrad worker: --name, --rank and --world-size (or env) are required")
    from distgrad.rpc import api
    from distgrad.rpc.options import RpcBackendOptions
    init_method = args.init_method
    if init_method is None and args.master_addr and args.master_port:
        init_method = f"tcp://{args.master_addr}:{args.master_port}"
    allowed = list(args.allow) + [m for m in os.environ.get("DISTGRAD_ALLOWED_MODULES", "").split(",") if m]
    pub, sec = os.environ.get("DISTGRAD_CURVE_PUBLIC_KEY"), os.environ.get("DISTGRAD_CURVE_SECRET_KEY")
    opts = RpcBackendOptions(
        init_method=init_method or "env://", transport=args.transport, bind_addr=args.bind_addr,
        allowed_modules=allowed, num_worker_threads=args.num_threads, rpc_timeout=args.rpc_timeout,
        curve_public_key=pub.encode() if pub else None, curve_secret_key=sec.encode() if sec else None)
    api.init_rpc(args.name, rank=args.rank, world_size=args.world_size, rpc_backend_options=opts)
    logging.getLogger("distgrad.rpc").info("serving as rank %d of %d", args.rank, args.world_size)
    try:
        api.shutdown(graceful=True)  # a barrier: returns once the whole world shuts down
    except Exception as e:  # noqa: BLE001 - e.g. the coordinator died: exit, don't hang
        logging.getLogger("distgrad.rpc").error("shutdown failed: %s", e)
        return 1
    logging.getLogger("distgrad.rpc").info("world shut down; exiting")
    return 0


def main(argv=None):
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
