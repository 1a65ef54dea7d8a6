"""Cases of a process-group world that a member runs against the others: forging another
rank's messages with its own credential, and what the transport made of them."""
import msgpack
import zmq

import distgrad
import distgrad.distributed as dist
from distgrad.distributed import process_group
from distgrad.distributed.messages import ABORT
from distgrad.rpc import wire
from support.forger import member_socket
from support.pg_world import registry

CASES, case = registry()


def _comm():
    return process_group._world.comm


@case
def sum_of_ranks(ctx):
    t = distgrad.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


@case
def abort_claiming(ctx, dst, src):
    """Send ``dst`` an ABORT of the default group whose header claims rank ``src``, from a
    socket with this rank's own credential; return the answer (kind, text) or None."""
    comm = _comm()
    transport = comm.transport
    gid = dist.group.WORLD._state.gid
    zctx = zmq.Context()
    try:
        s = member_socket(zctx, transport, dst)
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 5, src,
                                           [ABORT, gid, 1, 0, "forged"]), msgpack.packb(None)])
        if not s.poll(5000):
            return None
        frames = s.recv_multipart()
        kind, mid, _, _, _ = wire.unpack_header(frames[0])
        return [kind, msgpack.unpackb(frames[1])[2] if len(frames) > 1 else None]
    finally:
        zctx.destroy(linger=0)


@case
def dropped(ctx):
    return _comm().transport.stats["dropped"]
