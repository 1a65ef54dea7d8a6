"""Exception classes of the RPC layer and the rebuilding of remote exceptions.

PyTorch raises ``RuntimeError`` for RPC failures; every class here derives from
it so torch-style ``except RuntimeError`` keeps working.
"""
import builtins

from .. import codec

__all__ = ["RpcError", "RpcTimeoutError", "WorkerUnreachableError", "ProtocolError",
           "RefusedCallError", "RemoteError", "rebuild_exception"]


class RpcError(RuntimeError):
    """Base class of errors raised by the RPC layer."""


class RpcTimeoutError(RpcError, TimeoutError):
    """A call ran for more than its timeout (both RuntimeError and TimeoutError)."""


class WorkerUnreachableError(RpcError, ConnectionError):
    """A peer died or stopped answering heartbeats."""


class ProtocolError(RpcError):
    """A message could not be decoded (malformed, truncated, oversized, unknown version)."""


class RefusedCallError(RpcError, PermissionError):
    """The callable named by a request is not on the worker's allowlist."""


class RemoteError(RpcError):
    """A remote exception whose class is not a built-in one; ``remote_type`` names it."""

    def __init__(self, message, remote_type="Exception"):
        super().__init__(message)
        self.remote_type = remote_type


def describe_exception(exc, tb_text):
    """(type name, module, message, traceback) - what travels in an ERROR reply."""
    t = type(exc)
    return [t.__qualname__, t.__module__, str(exc), tb_text]


def rebuild_exception(type_name, module, message, tb_text, worker):
    """Re-create a remote exception on the caller.

    Built-in exception classes are re-raised as themselves (so ``except KeyError``
    works across the wire); anything else becomes a :class:`RemoteError`. The
    message carries the remote traceback text and the worker's name.
    """
    text = f"{message}\n\nRemote traceback (on worker {worker!r}):\n{tb_text}".rstrip()
    if module == "builtins":
        cls = getattr(builtins, type_name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(text)
            except Exception:  # classes whose constructor needs more arguments
                pass
    if module.startswith("distgrad.rpc.errors"):
        cls = globals().get(type_name)
        if isinstance(cls, type) and issubclass(cls, RpcError) and cls is not RemoteError:
            return cls(text)
    return RemoteError(f"{module}.{type_name}: {text}", remote_type=f"{module}.{type_name}")


def _decode_exception(payload, dec):
    type_name, module, message, tb_text = payload
    return rebuild_exception(type_name, module, message, tb_text, "?")


# An exception returned as a value (not raised) travels like an ERROR reply's body.
codec.register(BaseException, 9, lambda e, enc: describe_exception(e, ""), _decode_exception)
