"""A message's frames on a ZeroMQ socket: sent with large buffers zero-copy (a received
frame re-sent by reference), received as ``zmq.Frame`` objects, and counted."""
import zmq

__all__ = ["send_frames", "recv_frames", "frames_nbytes"]

_ZERO_COPY_MIN = 1 << 16  # below this, copying is cheaper than pyzmq's zero-copy bookkeeping


def _received_frame(a):
    """The zmq.Frame whose whole buffer array ``a`` views, if any: re-sending the Frame
    shares the message by reference count instead of registering a new zero-copy buffer."""
    b = a.base
    while b is not None and hasattr(b, "base") and not isinstance(b, memoryview):
        b = b.base
    if isinstance(b, memoryview) and isinstance(b.obj, zmq.Frame) and b.nbytes == a.nbytes:
        return b.obj
    return None


_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)  # plain ints: enum arithmetic is slow


def send_frames(sock, frames, flags=0):
    """Send a multipart message; large buffers go zero-copy."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        copy = True
        if type(f) is zmq.Frame:
            copy = False
        elif not isinstance(f, bytes) and f.nbytes >= _ZERO_COPY_MIN:
            received = _received_frame(f)
            if received is not None:
                f = received
            copy = False
        sock.send(f, flags | _SNDMORE if i < last else flags, copy=copy)


def frames_nbytes(frames):
    """Bytes of a message's frames (bytes, arrays or zmq Frames)."""
    n = 0
    for f in frames:
        n += len(f) if type(f) is bytes or type(f) is zmq.Frame else f.nbytes
    return n


def recv_frames(sock):
    """One waiting multipart message as zmq Frames (the caller knows one is waiting)."""
    f = sock.recv(_NOBLOCK, copy=False)
    frames = [f]
    while f.more:
        f = sock.recv(0, copy=False)
        frames.append(f)
    return frames
