"""Rank 0 of a launch: ``python -m distgrad.launch.rank0 RUN_DIR``, started by the supervisor.

It reads ``RUN_DIR/launch.json`` (the resolved config and the world to join), joins
the RPC world as "coordinator" and trains with :class:`~distgrad.launch.coordinator.Coordinator`
in the config's ``world.strategy``. A stage's failure becomes ``failure.json`` and exit
status 1.
"""
import json
import os
import signal
import sys

from distgrad.distributed import rpc
from distgrad.flush_denormal import flush_or_raise
from distgrad.utils.processes import die_with_parent

from .config import heartbeat_interval
from .coordinator import Coordinator
from .environment import own_address
from .placement import HOSTS, Placement
from .rundir import FAILURE, LAUNCH, write_json
from .stage_calls import StageFailure

__all__ = ["main"]


def _bind_addr(value):
    return None if value == "auto" else value  # None: chosen toward the rendezvous host


def _options(world):
    cfg = world["config"]
    hb = cfg["heartbeat_timeout"]
    return rpc.RpcBackendOptions(
        init_method=world["init_method"], transport=world["transport"],
        bind_addr=_bind_addr(world.get("bind_addr") or cfg["bind_addr"]),
        rpc_timeout=cfg["rpc_timeout"],
        heartbeat_interval=heartbeat_interval(hb), heartbeat_timeout=hb,
        rendezvous_timeout=cfg["rendezvous_timeout"], simulated_link=cfg.get("simulated_link"),
        allowed_modules=("distgrad.launch.progress",))  # the stages' step reports


def _placement(run_dir, world, workers):
    """Where every process runs (``hosts.json``), asked once the world has formed."""
    here = own_address(world["init_method"], world.get("bind_addr") or "auto")
    placement = Placement.gather(workers, here, world["config"]["rpc_timeout"])
    write_json(os.path.join(run_dir, HOSTS), placement.to_json())
    return placement


def _name_the_host(record, placement, world):
    """A worker that stopped answering is reported with its host, and as the host when
    none of the host's other workers answers either."""
    address = placement.host_of(record["rank"])
    if address is not None:
        record = dict(record, on=placement.label(address))
    lost = placement.lost_host(record["rank"], world["config"]["heartbeat_timeout"] + 2.0)
    if lost is not None:
        record["host"] = lost
    return record


def _what_failed(record):
    lost = record.get("host")
    if lost is None:
        return f"{record['worker']} ({record['place']}) failed"
    ranks = lost["ranks"]
    return f"{lost['label']} is lost (rank{'s' if len(ranks) > 1 else ''} " \
           f"{', '.join(map(str, ranks))})"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m distgrad.launch.rank0 RUN_DIR", file=sys.stderr)
        return 2
    run_dir = argv[0]
    if os.environ.get("DISTGRAD_PDEATHSIG"):
        die_with_parent()
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # user modules named in the config, as for workers
    with open(os.path.join(run_dir, LAUNCH), encoding="utf-8") as fh:
        launch = json.load(fh)
    world = dict(launch["world"], config=launch["config"]["world"])
    if world["config"]["flush_denormal"]:  # the coordinator computes too (losses, a backward)
        try:
            flush_or_raise("world.flush_denormal")
        except RuntimeError as e:
            print(e, file=sys.stderr, flush=True)
            return 1
    coordinator = Coordinator(run_dir, launch)
    for sig in (signal.SIGTERM, signal.SIGINT):  # stop at the next step boundary
        signal.signal(sig, lambda *_: coordinator.stop_requested.set())
    try:
        rpc.init_rpc("coordinator", rank=0, world_size=len(coordinator.workers) + 1,
                     rpc_backend_options=_options(world))
    except rpc.RpcError as e:  # the world did not form: say why in one line, no traceback
        print(f"the world did not form: {e}", file=sys.stderr, flush=True)
        return 1
    placement = _placement(run_dir, world, coordinator.workers) if world.get("hosts") else None
    try:
        result = coordinator.run()
    except StageFailure as f:
        record = f.record
        if placement is not None and record["reason"] == "unreachable":
            record = _name_the_host(record, placement, world)
        write_json(os.path.join(run_dir, FAILURE), record)
        print(f"stopping: {_what_failed(record)} at step {record['step']}: "
              f"{record['message']}", file=sys.stderr, flush=True)
        rpc.shutdown(graceful=False)
        return 1
    rpc.shutdown(graceful=True)
    print(f"{result['status']} at step {result['step']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
