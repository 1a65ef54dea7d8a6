"""``torch.distributed.rpc.functions``: ``async_execution``; and distgrad's own
``never_blocks`` and ``receives_caller`` (PyTorch has no such markers)."""
import sys


def async_execution(fn):
    """Mark ``fn`` as returning a Future: the reply is sent when that Future completes,
    without holding a handler thread meanwhile."""
    fn._distgrad_async_execution = True
    return fn


def never_blocks(fn):
    """Mark ``fn`` as short and never blocking (no I/O, no sleep, no RPC; a lock held only
    for a moment), so a process serves calls of it where they arrive, on its I/O thread,
    instead of handing them to a handler thread: no thread hand-off on the callee.

    Only for functions that keep that promise: while ``fn`` runs, that process receives
    nothing else. The marker is read on the callee, on the function it resolved itself, so
    a caller cannot make another function run there. distgrad marks its own (launch's
    ``deliver``); a user's functions run on handler threads, as PyTorch runs them on a pool.

    >>> @never_blocks
    ... def put(key, value): ...
    """
    fn._distgrad_never_blocks = True
    _marked.add(f"{fn.__module__}:{fn.__qualname__}")
    return fn


def receives_caller(fn):
    """Mark ``fn`` as told who calls it: a process serving a call of ``fn`` passes the
    caller's :class:`~distgrad.rpc.WorkerInfo` as the keyword argument ``caller``, taken
    from the connection the call came on (authenticated), never from anything the caller
    wrote; a call that sends ``caller`` itself is refused. For functions whose answer
    depends on who asks (a report of a worker's own work), which must not trust a rank
    named in the arguments.

    >>> @receives_caller
    ... def report(done, caller=None): ...
    """
    fn._distgrad_receives_caller = True
    return fn


# References of the functions marked in this process: their modules are imported here, so
# the I/O thread may resolve them itself (it never imports) instead of handing their first
# call to a handler thread for that.
_marked = set()


def resolves_without_import(ref):
    """Whether ``ref`` names a function marked :func:`never_blocks` here whose module has
    finished importing: resolving it imports nothing."""
    if ref not in _marked:
        return False
    module = sys.modules.get(ref.partition(":")[0])
    return module is not None and not getattr(getattr(module, "__spec__", None),
                                              "_initializing", False)
