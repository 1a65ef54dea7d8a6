"""The floor of distgrad's RPC design, not of its sockets: a round trip with the same
threads and hand-offs as ``rpc_sync`` and nothing else (no codec, no header, no
interceptors, no admission, no bookkeeping), for ``bench_rpc.py``.

Callee: an I/O thread polls a ROUTER; it hands each request to a handler thread (a
deque and a lock, the cheapest hand-over in CPython), which replies from a DEALER of
its own to the caller's ROUTER; or, ``on_arrival``, the I/O thread replies itself (what
``never_blocks`` functions get). Caller: the calling thread sends from a DEALER of its
own; an I/O thread polls the caller's ROUTER and wakes the calling thread. Threads are
woken with a plain lock, the cheapest hand-over in CPython (one call at a time: a
ping-pong).

Raw pyzmq (``bench_rpc.RawClient``) pays the sockets only; this pays the sockets and
the threads; distgrad pays those and its layers. So distgrad / skeleton is what the
layers cost, skeleton / raw what the threads cost.
"""
import collections
import multiprocessing as mp
import threading

import zmq

__all__ = ["SkeletonClient"]

_STOP = b"stop"


def _callee(port_q, on_arrival):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port_q.put(router.bind_to_random_port("tcp://127.0.0.1"))
    jobs, ready = collections.deque(), _Signal()

    def handler():
        mine = {}  # the handler's own sockets, per caller endpoint
        while True:
            ready.wait()
            while jobs:
                endpoint, payload = jobs.popleft()
                if endpoint is None:
                    for s in mine.values():
                        s.close(linger=0)
                    return
                _reply(ctx, mine, endpoint, payload)

    thread = threading.Thread(target=handler, daemon=True)
    thread.start()
    io_sockets = {}
    while router.poll(30000):
        _, endpoint, payload = router.recv_multipart(copy=False)
        endpoint = endpoint.bytes
        if endpoint == _STOP:
            break
        if on_arrival:
            _reply(ctx, io_sockets, endpoint, payload)
        else:
            jobs.append((endpoint, payload))
            ready.signal()
    jobs.append((None, None))
    ready.signal()
    thread.join(10)
    for s in io_sockets.values():
        s.close(linger=0)
    router.close()
    ctx.term()


class _Signal:
    """Wakes one waiting thread; signals given while nobody waits collapse into one (the
    waiter drains its queue after each wake-up)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()

    def wait(self):
        self._lock.acquire()

    def signal(self):
        try:
            self._lock.release()
        except RuntimeError:  # signalled already
            pass


def _reply(ctx, sockets, endpoint, payload):
    s = sockets.get(endpoint)
    if s is None:
        s = sockets[endpoint] = ctx.socket(zmq.DEALER)
        s.linger = 0
        s.connect(endpoint.decode())
    s.send(payload, copy=False)


class SkeletonClient:
    """``client(a)``: one round trip of array ``a``'s bytes through the skeleton."""

    def __init__(self, on_arrival=False):
        spawn = mp.get_context("spawn")
        port_q = spawn.Queue()
        self.proc = spawn.Process(target=_callee, args=(port_q, on_arrival), daemon=True)
        self.proc.start()
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.endpoint = ("tcp://127.0.0.1:%d" % self.router.bind_to_random_port(
            "tcp://127.0.0.1")).encode()
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.linger = 0
        self.dealer.connect(f"tcp://127.0.0.1:{port_q.get(timeout=30)}")
        self._replies = collections.deque()
        self._arrived = _Signal()
        self._stop = False
        self._io = threading.Thread(target=self._poll, daemon=True)
        self._io.start()

    def _poll(self):
        while not self._stop:
            if self.router.poll(100):
                _, payload = self.router.recv_multipart(copy=False)
                self._replies.append(payload)
                self._arrived.signal()

    def __call__(self, a):
        self.dealer.send_multipart([self.endpoint, a], copy=False)
        self._arrived.wait()
        return self._replies.popleft()

    def close(self):
        self.dealer.send_multipart([_STOP, b""])
        self.proc.join(10)
        self._stop = True
        self._io.join(10)
        self.dealer.close()
        self.router.close()
        self.ctx.term()
