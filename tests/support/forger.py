"""A member that forges: run on a worker of a test world, it speaks the protocol by hand
with its own credential (it is a member) but claims what it is not."""
import msgpack
import zmq

from distgrad.rpc import current_agent, wire


def call_body(target, args=(), kwargs=None, remote=None):
    return msgpack.packb([target, list(args), kwargs or {}, remote])


def member_socket(ctx, transport, dst, identity=None, credential=True, events=0):
    """A DEALER of ``ctx`` connected to rank ``dst`` of ``transport``'s world, presenting
    that transport's credential (unless ``credential`` is False), with routing
    ``identity`` if given. With ``events``: ``(socket, monitor)``, the monitor of those
    events attached before it connects (else the first ones may pass unseen)."""
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    if identity is not None:
        s.identity = identity
    if credential:
        for option, value in transport.client_options(dst).items():
            setattr(s, option, value)
    monitor = s.get_monitor_socket(events) if events else None
    s.connect(transport.endpoints[dst])
    return (s, monitor) if events else s


def send_forged(dst, kind, src, target, args=(), extra=None, identity=None, mid=77,
                credential=True, timeout=3.0):
    """Send ``target(*args)`` to rank ``dst`` in a message of ``kind`` whose header claims
    rank ``src``, from a socket of this process (with its credential unless
    ``credential`` is False, with routing ``identity`` if given). Returns the answer as
    ``[kind, msg_id, body]`` (body decoded), or None when nothing came within ``timeout``."""
    transport = current_agent().transport
    ctx = zmq.Context()
    try:
        s = member_socket(ctx, transport, dst, identity, credential)
        s.send_multipart([wire.pack_header(kind, mid, src, extra), call_body(target, args)])
        if not s.poll(int(timeout * 1000)):
            return None
        frames = s.recv_multipart()
        answer_kind, answer_mid, _, _, _ = wire.unpack_header(frames[0])
        return [answer_kind, answer_mid, msgpack.unpackb(frames[1]) if len(frames) > 1 else None]
    finally:
        ctx.destroy(linger=0)


_held = {}


def take_identity(dst, identity, mid=78):
    """Connect to rank ``dst`` as this process (its credential) presenting routing
    ``identity`` (another rank's, say: a member trying to take over another's connection),
    wait until the handshake succeeded and send a CALL of ``add`` claiming the rank in
    front of ``identity`` on it; the socket stays until :func:`give_identity_back`."""
    transport = current_agent().transport
    ctx = zmq.Context()
    s, monitor = member_socket(ctx, transport, dst, identity,
                               events=zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        if not monitor.poll(20000):
            raise TimeoutError(f"no handshake with rank {dst} within 20 s")
    except BaseException:
        ctx.destroy(linger=0)
        raise
    finally:
        s.disable_monitor()
        monitor.close(linger=0)
    claimed = int(identity.split(b":")[0]) if identity[:1].isdigit() else 0
    s.send_multipart([wire.pack_header(wire.Kind.CALL, mid, claimed),
                      call_body("support.rpc_funcs:add", (1, 2))])
    _held[dst] = (ctx, s)
    return True


def give_identity_back(dst):
    """Close the socket :func:`take_identity` made; return the messages that came on it."""
    ctx, s = _held.pop(dst)
    try:
        received = []
        while s.poll(0):
            frames = s.recv_multipart()
            kind, mid, _, _, _ = wire.unpack_header(frames[0])
            received.append([kind, mid])
        return received
    finally:
        ctx.destroy(linger=0)


def calls_beside_a_taker(dst, dst_name, taker, n=200):
    """On the member whose connection is at stake: call ``dst`` from this thread, have
    ``taker`` (a member's name) connect to ``dst`` presenting this thread's socket's own
    identity while ``n`` calls are in flight on it, make ``n`` more, and return the
    results of all of them and what came on the taker's socket."""
    from distgrad.distributed import rpc
    from support.rpc_funcs import add
    assert rpc.rpc_sync(dst_name, add, (0, 0)) == 0
    identity = current_agent().transport.own_sockets.mine()[dst].identity
    futures = [rpc.rpc_async(dst_name, add, (i, i)) for i in range(n)]
    took = rpc.rpc_sync(taker, take_identity, (dst, identity))
    futures += [rpc.rpc_async(dst_name, add, (i, i)) for i in range(n, 2 * n)]
    results = [f.wait(30) for f in futures]
    return identity.decode(), took, results, rpc.rpc_sync(taker, give_identity_back, (dst,))


def flood(dst, bodies, timeout=30.0):
    """Send every body of ``bodies`` as a CALL to rank ``dst`` from one socket of this
    process (as itself: a member that floods, it forges nothing), all at once; return the
    answers' kinds and texts (an ERROR's message), in the order they came, once all came
    or ``timeout`` passed."""
    import time
    transport = current_agent().transport
    ctx = zmq.Context()
    try:
        s = member_socket(ctx, transport, dst)
        for i, body in enumerate(bodies):
            s.send_multipart([wire.pack_header(wire.Kind.CALL, i + 1, transport.rank), body])
        answers, end = [], time.monotonic() + timeout
        while len(answers) < len(bodies) and time.monotonic() < end:
            if s.poll(100):
                frames = s.recv_multipart()
                kind = wire.unpack_header(frames[0])[0]
                body = msgpack.unpackb(frames[1]) if kind == wire.Kind.ERROR else None
                answers.append([kind, body[2] if body else None])
        return answers
    finally:
        ctx.destroy(linger=0)


def handler_threads():
    """(threads of the handler pool now, the most it ever had)."""
    pool = current_agent().pool
    return pool._threads, pool.peak


def set_share(n):
    """Make every peer's share of this process's handler threads ``n`` (a test's small
    world has shares of hundreds); returns the old share."""
    gate = current_agent().lifecycle.dispatcher.gate
    old, gate.serving = gate.serving, n
    return old
