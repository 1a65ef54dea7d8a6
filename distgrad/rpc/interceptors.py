"""Message interceptors: the extension point through which features ride on RPC messages.

Distributed autograd records send/recv nodes this way; a test harness can
delay, drop or fail messages this way. An interceptor is an object with any of
these methods (absent ones are skipped):

``on_send_request(dst, args, kwargs) -> (args, kwargs, extra)``
    on the caller's thread, before a CALL is encoded; ``dst`` is the
    :class:`WorkerInfo`. ``extra`` (small, msgpack-able, or None) rides in the
    header; with several interceptors each one's extra travels under its
    ``name`` in a map.
``installer_for(dst) -> "module:qualname" or None``
    with ``on_send_request``, for an interceptor whose extra a peer can only read with
    the interceptor installed: the entry point that installs it, while ``dst`` may not
    have it yet (None once it does). The reference rides in the header (under
    :data:`INSTALL`) and the receiver runs it (resolved against its allowlist, on a handler
    thread, once per process) before its ``on_receive_request`` runs: a feature reaches
    a new peer without a round trip of its own.
``on_send_call(dst, what, how) -> extra``
    on the caller's thread, once every ``on_send_request`` ran (what they did, such as
    a call of their own, comes before), for an interceptor that needs to know what
    is called: ``what`` is the target's ``module:qualname`` (or ``@op``),
    ``how`` is ``"rpc_async"`` (a call with a reply, also behind ``rpc_sync``),
    ``"remote"`` or ``"notify"`` (one-way). Its extra (None: nothing) travels like
    ``on_send_request``'s, under the interceptor's name (implement one of the two).
``on_receive_request(request, args, kwargs) -> (args, kwargs)``
    on the handler's thread, after the CALL is decoded; ``request`` is the
    :class:`~distgrad.rpc.dispatch.Request` (source worker, message id, header
    extras, and a ``state`` dict where interceptors keep what the reply needs).
``request_scope(request) -> context manager or None``
    the handler runs inside it (the autograd context of the request, say); None: no
    scope for this request.
``on_send_response(request, value) -> (value, extra)``
    on whichever thread produces the reply: the handler's, or the thread that
    completes an ``async_execution`` Future later. Everything it needs is on
    ``request``, never in a thread-local.
``on_receive_response(src, extra, value) -> value``
    on the thread that receives the reply (the caller's for ``rpc_sync``, the
    I/O thread for ``rpc_async``): it must not block.
``on_send_message(dst, kind, what) -> copies``
    on the sending thread, once a message is encoded and before it is sent:
    ``kind`` is ``"request"`` (a CALL) or ``"response"`` (a REPLY), ``what``
    the ``module:qualname`` or ``@op`` it calls or answers, ``dst`` the
    :class:`WorkerInfo` it goes to. It returns how many copies to send: ``0``
    drops the message (its caller times out), ``2`` duplicates it (a second
    reply is dropped as late), ``None`` means one. It may sleep (the message
    leaves later) or raise (a request's caller gets the exception; a response
    becomes an error reply). This is the seam of fault injection
    (``distgrad.testing.faults``); messages the I/O thread sends on its own
    (RRef releases) do not pass through it, and a message whose arrays ride in
    shared memory is sent at most once.

Error replies do not pass through interceptors.
"""
import threading

from .errors import ProtocolError

__all__ = ["add", "remove", "installed", "extra_of", "copies", "hold_messages", "INSTALL",
           "installers_of"]

#: The header extra key of the installers a receiver is asked to run first (a list of
#: ``module:qualname``); no interceptor may be named so.
INSTALL = "@install"

_lock = threading.Lock()
_chain = ()  # replaced, never mutated: readers take it without a lock

_HOOKS = ("on_send_request", "on_send_call", "on_receive_request", "request_scope",
          "on_send_response", "on_receive_response", "on_send_message")
# hook name -> ((interceptor name, interceptor, its bound hook), ...) in installation order,
# replaced with the chain: a message asks only the interceptors that have a hook, instead of
# every interceptor by getattr (several per message, on every message of the process)
_hooks = {h: () for h in _HOOKS}


def _set_chain(chain):
    """Install ``chain`` and its hook tables (under ``_lock``)."""
    global _chain, _hooks
    hooks = {h: tuple((n, ic, getattr(ic, h)) for n, ic in chain
                      if getattr(ic, h, None) is not None) for h in _HOOKS}
    _hooks, _chain = hooks, chain


def add(interceptor, name=None):
    """Install ``interceptor`` (once; ``name`` keys its header extra, default its class name)."""
    name = name or type(interceptor).__name__
    with _lock:
        if any(i is interceptor for _, i in _chain):
            return
        if any(n == name for n, _ in _chain) or name == INSTALL:
            raise ValueError(f"an interceptor named {name!r} is already installed")
        _set_chain(_chain + ((name, interceptor),))


def remove(interceptor):
    with _lock:
        _set_chain(tuple((n, i) for n, i in _chain if i is not interceptor))


def installed():
    """((name, interceptor), ...) in installation order."""
    return _chain


def send_request(dst, args, kwargs, what=None, how="rpc_async"):
    """Run every ``on_send_request`` and ``on_send_call``; return (args, kwargs, header
    extra)."""
    hooks = _hooks
    requests, calls = hooks["on_send_request"], hooks["on_send_call"]
    if not requests and not calls:
        return args, kwargs, None
    extras = {}
    for name, ic, f in requests:
        args, kwargs, extra = f(dst, args, kwargs)
        if extra is not None:
            extras[name] = extra
            installer = getattr(ic, "installer_for", None)
            ref = installer(dst) if installer is not None else None
            if ref is not None:
                extras.setdefault(INSTALL, []).append(ref)
    if what is not None:
        for name, _, f in calls:
            extra = f(dst, what, how)
            if extra is not None:
                extras[name] = extra
    return args, kwargs, extras or None


def receive_request(request, args, kwargs):
    for _, _, f in _hooks["on_receive_request"]:
        args, kwargs = f(request, args, kwargs)
    return args, kwargs


def request_scopes(request):
    """The context managers the handler of ``request`` runs in (outermost first)."""
    out = []
    for _, _, f in _hooks["request_scope"]:
        scope = f(request)
        if scope is not None:
            out.append(scope)
    return out


def send_response(request, value):
    extras = None
    for name, _, f in _hooks["on_send_response"]:
        value, extra = f(request, value)
        if extra is not None:
            if extras is None:
                extras = {}
            extras[name] = extra
    return value, extras


def receive_response(src, extras, value):
    for name, _, f in _hooks["on_receive_response"]:
        value = f(src, extra_of(extras, name), value)
    return value


def copies(dst, kind, what):
    """How many times to send an outgoing message (each ``on_send_message`` multiplies)."""
    n = 1
    for _, _, f in _hooks["on_send_message"]:
        c = f(dst, kind, what)
        if c is not None:
            n *= c
    return n


def hold_messages():
    """Whether an installed interceptor may hold outgoing messages (``on_send_message``: it
    may sleep), so a reply must not be produced on the I/O thread."""
    return bool(_hooks["on_send_message"])


def installers_of(extras):
    """The installers a request's header asks its receiver to run first (see
    ``installer_for``): a list of references, empty when none; ProtocolError if malformed."""
    refs = extras.get(INSTALL) if type(extras) is dict else None
    if refs is None:
        return ()
    if type(refs) is not list or len(refs) > 8 or not all(type(r) is str for r in refs):
        raise ProtocolError(f"malformed {INSTALL} header extra")
    return refs


def extra_of(extras, name):
    """This interceptor's part of a header's extras (None if absent or malformed)."""
    return extras.get(name) if type(extras) is dict else None
