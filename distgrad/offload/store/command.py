"""``distgrad store``: run an activation store until SIGTERM/SIGINT.

    distgrad store --bind tcp://127.0.0.1:0 --memory-bytes 4G --spill-dir /scratch

The first line on stdout is ``distgrad store serving at <endpoint>`` (the real
endpoint when port 0 was asked for); ``--endpoint-file`` also writes the
endpoint to a file, for launchers. Every option falls back to an environment
variable named in ``--help``. :func:`spawn_store` starts one as a child process
and hands back its endpoint.
"""
import argparse
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time

from ...utils.cli import env, in_range
from ...utils.processes import die_with_parent

__all__ = ["HELP", "add_arguments", "run", "main", "spawn_store", "parse_bytes"]

HELP = "run an activation store (blobs for offloaded activations) until stopped"
READY_PREFIX = "distgrad store serving at "
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text):
    """``"512M"`` -> 536870912 (K, M, G, T are powers of 1024; a plain number is bytes)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a byte count (e.g. 1048576, 512M, 4G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _byte_count(low=0):
    def parse(text):
        try:
            value = parse_bytes(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is out of range: must be at least {low}")
        return value
    parse.__name__ = "byte count"
    return parse


def add_arguments(p):
    p.add_argument("--bind", default=env("DISTGRAD_STORE_BIND", "tcp://127.0.0.1:0"),
                   help="endpoint to serve on: tcp://HOST:PORT (port 0 picks a free one) or "
                        "ipc:///path (default: %(default)s; env: DISTGRAD_STORE_BIND)")
    p.add_argument("--memory-bytes", type=_byte_count(0),
                   default=env("DISTGRAD_STORE_MEMORY_BYTES", "1G"),
                   help="bytes of blobs held in memory before spilling to disk; K/M/G "
                        "suffixes (default: %(default)s; env: DISTGRAD_STORE_MEMORY_BYTES)")
    p.add_argument("--spill-dir", default=env("DISTGRAD_STORE_SPILL_DIR"),
                   help="directory for spilled blobs, in a per-run subdirectory swept after a "
                        "crash (default: the system temp dir; env: DISTGRAD_STORE_SPILL_DIR)")
    p.add_argument("--spill-bytes", type=_byte_count(0), default=env("DISTGRAD_STORE_SPILL_BYTES"),
                   help="most bytes spilled to disk, then puts are refused; 0 never spills "
                        "(default: unlimited; env: DISTGRAD_STORE_SPILL_BYTES)")
    p.add_argument("--heartbeat-interval", type=in_range(float, 0.01, 60.0), metavar="SECONDS",
                   default=float(env("DISTGRAD_STORE_HEARTBEAT_INTERVAL", 0.5)),
                   help="seconds between ZMTP heartbeats to each client (default: %(default)s; "
                        "env: DISTGRAD_STORE_HEARTBEAT_INTERVAL)")
    p.add_argument("--heartbeat-timeout", type=in_range(float, 0.05, 600.0), metavar="SECONDS",
                   default=float(env("DISTGRAD_STORE_HEARTBEAT_TIMEOUT", 3.0)),
                   help="seconds without an answer before a client counts as dead and its "
                        "blobs are freed (default: %(default)s; env: "
                        "DISTGRAD_STORE_HEARTBEAT_TIMEOUT)")
    p.add_argument("--endpoint-file", default=env("DISTGRAD_STORE_ENDPOINT_FILE"),
                   help="also write the endpoint to this file (env: DISTGRAD_STORE_ENDPOINT_FILE)")
    p.add_argument("--log-level", default=env("DISTGRAD_LOG_LEVEL", "WARNING"),
                   choices=("DEBUG", "INFO", "WARNING", "ERROR"), type=str.upper,
                   help="(default: %(default)s; env: DISTGRAD_LOG_LEVEL)")
    return p


def run(args, parser=None):
    parser = parser or add_arguments(argparse.ArgumentParser(prog="distgrad store"))
    if args.heartbeat_timeout <= args.heartbeat_interval:
        parser.error("--heartbeat-timeout must exceed --heartbeat-interval")
    if args.spill_dir is not None and not os.path.isdir(args.spill_dir):
        parser.error(f"--spill-dir {args.spill_dir!r} is not a directory")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s store %(levelname)s %(name)s: %(message)s")
    if os.environ.get("DISTGRAD_PDEATHSIG"):
        die_with_parent()
    from .server import StoreServer
    try:
        server = StoreServer(args.bind, memory_bytes=args.memory_bytes,
                             spill_directory=args.spill_dir, spill_bytes=args.spill_bytes,
                             heartbeat_interval=args.heartbeat_interval,
                             heartbeat_timeout=args.heartbeat_timeout)
    except Exception as e:  # noqa: BLE001 - one line that says why
        print(f"distgrad store: cannot serve at {args.bind}: {e}", file=sys.stderr)
        return 1
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    if args.endpoint_file:
        tmp = args.endpoint_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(server.endpoint + "\n")
        os.replace(tmp, args.endpoint_file)
    print(READY_PREFIX + server.endpoint, flush=True)
    server.serve_forever()
    return 0


def main(argv=None):
    parser = add_arguments(argparse.ArgumentParser(prog="distgrad store", description=HELP))
    return run(parser.parse_args(argv), parser)


@contextlib.contextmanager
def spawn_store(*args, env=None, timeout=30.0):
    """Run ``python -m distgrad store *args`` as a child; yield ``(endpoint, process)``.

    The child dies with this process (Linux) and is terminated, then killed, and
    reaped on leaving the block, also when the block raised.
    """
    # the child imports the same distgrad as this process, wherever it runs from
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    child_env = dict(os.environ, DISTGRAD_PDEATHSIG="1", PYTHONPATH=path, **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "distgrad", "store", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env)
    try:
        endpoint = _await_endpoint(proc, timeout)
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)
        for stream in (proc.stdout, proc.stderr):
            stream.close()


def _await_endpoint(proc, timeout):
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise RuntimeError(f"distgrad store did not report its endpoint within {timeout:g} s")
            line = proc.stdout.readline()
            if line.startswith(READY_PREFIX):
                return line[len(READY_PREFIX):].strip()
            if not line:
                err = proc.stderr.read() if proc.poll() is not None else ""
                raise RuntimeError(f"distgrad store exited with {proc.wait(5.0)}: {err.strip()}")
    finally:
        sel.close()
