"""Exception classes of the RPC layer and the rebuilding of remote exceptions.

PyTorch raises ``RuntimeError`` for RPC failures; every class here derives from
it so torch-style ``except RuntimeError`` keeps working. An exception raised
by a remote function arrives as a class that is *both* a :class:`RemoteError`
(so a ``RuntimeError``, as PyTorch raises) and the original built-in class (so
``except KeyError`` works too), carrying the worker's name and the remote
traceback text.
"""
import builtins
import threading

from .. import codec

__all__ = ["RpcError", "RpcTimeoutError", "WorkerUnreachableError", "ProtocolError",
           "RefusedCallError", "RemoteError", "BackpressureError", "UnknownWorkerError",
           "UnsendableError", "rebuild_exception", "describe_exception"]


class RpcError(RuntimeError):
    """Base class of errors raised by the RPC layer."""


class RpcTimeoutError(RpcError, TimeoutError):
    """A call ran for more than its timeout (both RuntimeError and TimeoutError)."""


class WorkerUnreachableError(RpcError, ConnectionError):
    """A peer died, stopped, or left the world."""


class ProtocolError(RpcError):
    """A message could not be decoded (malformed, truncated, oversized, unknown version)."""


class UnknownTypeError(ProtocolError):
    """A message holds a value of a type this process has not registered (yet)."""


class RefusedCallError(RpcError, PermissionError):
    """The callable named by a request is not on the worker's allowlist."""


class UnknownWorkerError(RpcError, ValueError):
    """No worker of the world has that name or rank."""


class UnsendableError(RpcError, TypeError):
    """A value that cannot travel (no pickling: only what the codec encodes)."""


class BackpressureError(RpcError):
    """Too many calls to one worker are in flight and the caller asked not to wait."""


class RemoteError(RpcError):
    """An exception raised on another worker.

    ``remote_type`` is its class as ``module.qualname``, ``worker`` the worker's
    name, ``remote_traceback`` the traceback text printed there.
    """

    def __init__(self, message, remote_type="Exception", worker=None, remote_traceback=""):
        super().__init__(message)
        self.remote_type = remote_type
        self.worker = worker
        self.remote_traceback = remote_traceback


def describe_exception(exc, tb_text):
    """(type name, module, message, traceback) - what travels in an ERROR reply."""
    t = type(exc)
    if isinstance(exc, RemoteError) and type(exc).__module__ == __name__ + "._remote":
        t = next(b for b in t.__mro__[1:] if b is not RemoteError and not issubclass(RemoteError, b))
    return [t.__qualname__, t.__module__, str(exc), tb_text]


_remote_classes = {}
_remote_lock = threading.Lock()


def _remote_class(cls):
    """``Remote<cls>``: both :class:`RemoteError` and ``cls`` (None if they cannot combine)."""
    with _remote_lock:
        if cls not in _remote_classes:
            try:
                made = type(f"Remote{cls.__name__}", (RemoteError, cls), {
                    "__module__": __name__ + "._remote", "__str__": RemoteError.__str__,
                    "__init__": RemoteError.__init__})
            except TypeError:  # instance layouts that cannot combine (e.g. UnicodeError)
                made = None
            _remote_classes[cls] = made
        return _remote_classes[cls]


def rebuild_exception(type_name, module, message, tb_text, worker):
    """Re-create a remote exception on the caller.

    The result is catchable as ``RuntimeError``/:class:`RemoteError` and, for a
    built-in class, as that class; distgrad's own RPC errors come back as
    themselves. The message carries the remote traceback and the worker's name.
    """
    text = f"{message}\n\nRemote traceback (on worker {worker!r}):\n{tb_text}".rstrip()
    if not all(isinstance(x, str) for x in (type_name, module, message, tb_text)):
        return ProtocolError(f"malformed error reply from worker {worker!r}")
    if module.startswith(__name__):
        cls = globals().get(type_name)
        if isinstance(cls, type) and issubclass(cls, RpcError) and cls is not RemoteError:
            return cls(text)
    full = f"{module}.{type_name}"
    if module == "builtins":
        cls = getattr(builtins, type_name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            made = RemoteError if cls is RuntimeError else _remote_class(cls)
            try:
                return made(text, full, worker, tb_text)
            except TypeError:  # no class, or one whose constructor needs more arguments
                pass
    return RemoteError(f"{full}: {text}", full, worker, tb_text)


def _decode_exception(payload, dec):
    if type(payload) is not list or len(payload) != 4:
        raise codec.CodecError("malformed exception")
    type_name, module, message, tb_text = payload
    return rebuild_exception(type_name, module, message, tb_text, "?")


# An exception returned as a value (not raised) travels like an ERROR reply's body.
codec.register(BaseException, 9, lambda e, enc: describe_exception(e, ""), _decode_exception)
