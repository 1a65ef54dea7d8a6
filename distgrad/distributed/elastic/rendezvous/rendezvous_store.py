"""The store the torchrun agents of a multi-node launch meet at: a :class:`TCPStore` that
one agent serves (node 0's with the static rendezvous, the one on the endpoint's host
with ``c10d``, as torchrun's) and the others reach.

With a world secret (the same ``DISTGRAD_WORLD_SECRET``, or ``DISTGRAD_WORLD_SECRET_FILE``,
on every host) the store runs CURVE with a key pair derived from the secret: only agents
holding the same secret are answered, what they say is encrypted, and the secret itself
never crosses the wire. Before using the store an agent watches one ZeroMQ handshake with
it (a socket monitor), so that each way of not meeting has its own message naming the
host, the address and the cause: the name does not resolve, nothing answers there
within the rendezvous timeout, or the store refuses this agent's secret (or one side
has a secret and the other none).
"""
import hashlib
import hmac
import re
import socket
import time

import zmq
from zmq.utils import z85

from ....utils import addresses
from ....utils.socket_monitor import recv_monitor_event
from ...errors import DistNetworkError
from ...store import TCPStore
from .api import RendezvousConnectionError

__all__ = ["curve_keys", "parse_endpoint", "open_store"]

_KEY_LABEL = b"distgrad torchrun agents' store"
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_PROBE_EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | _HANDSHAKE_FAILED
_MECHANISM_MISMATCH = 0x11000002  # ZMTP: the two sides use different security mechanisms
# Handshakes refused this many times over this long (ZeroMQ retries every 0.1-0.2 s) are
# refused for good, unless one says why sooner (the two sides' mechanisms differ)
_REFUSALS, _REFUSAL_WINDOW = 3, 1.0


def curve_keys(secret):
    """The CURVE key pair (public, secret; Z85 bytes) of the agents' store of a world whose
    secret is ``secret`` (text or bytes); None without a secret."""
    if not secret:
        return None
    raw = secret.encode() if isinstance(secret, str) else secret
    private = z85.encode(hmac.new(raw, _KEY_LABEL, hashlib.sha256).digest())
    return zmq.curve_public(private), private


def parse_endpoint(endpoint, default_port):
    """(host, port) of ``host[:port]`` (IPv6 in brackets), as torchrun reads a rendezvous
    endpoint; ValueError naming it when it is not one."""
    endpoint = (endpoint or "").strip()
    if not endpoint:
        return "localhost", default_port
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, port = endpoint[1:-1], default_port
    else:
        host, sep, port_text = endpoint.rpartition(":")
        if not sep:
            host, port = endpoint, default_port
        else:
            if not re.fullmatch(r"[0-9]{1,5}", port_text) or int(port_text) >= 65536:
                raise ValueError(f"The port number of the rendezvous endpoint '{endpoint}' "
                                 "must be an integer between 0 and 65536.")
            port = int(port_text)
        host = host.strip("[]")
    if not re.fullmatch(r"[\w.:-]+", host):
        raise ValueError(f"The hostname of the rendezvous endpoint '{endpoint}' must be a "
                         "dot-separated list of labels, an IPv4 address, or an IPv6 address.")
    return host, port


def _where(host, ip, port):
    return f"{host}:{port}" if host == ip else f"{host}:{port} ({ip})"


def open_store(host, port, serve, *, secret, timeout, read_timeout, fallback=False):
    """(store, served here) of the agents' store at ``host:port``. ``serve``: this agent
    serves it (with ``fallback``, it becomes a client where the port is taken: another
    agent on this machine serves it). A client first waits up to ``timeout`` s for the
    store's handshake; :class:`RendezvousConnectionError` says why it failed."""
    keys = curve_keys(secret)
    try:
        ip = addresses.resolve(host, "the rendezvous host")
    except addresses.AddressError as e:
        raise RendezvousConnectionError(f"cannot meet the other nodes' agents at {host}:{port}:"
                                        f" {e}") from None
    if serve:
        try:
            return TCPStore(host, port, is_master=True, timeout=read_timeout,
                            wait_for_workers=False, curve=keys), True
        except DistNetworkError as e:
            if not fallback:
                raise RendezvousConnectionError(f"this agent cannot serve the rendezvous store "
                                                f"at {_where(host, ip, port)}: {e}") from None
    _handshake(host, ip, port, keys, timeout)
    return TCPStore(ip, port, is_master=False, timeout=read_timeout, curve=keys), False


def _handshake(host, ip, port, keys, timeout):
    """Return once a ZeroMQ handshake with the store at ``ip:port`` succeeded; raise
    :class:`RendezvousConnectionError` when it fails or nothing answers in ``timeout`` s."""
    where = _where(host, ip, port)
    outcome = _attempt(ip, port, keys, timeout)
    if outcome == "ok":
        return
    if outcome == "refused":
        # Which side lacks the secret: the refusals' detail says so only sometimes (the
        # side that notices first closes), so ask again without a secret: a store that
        # answers that has none
        if keys is None:
            raise RendezvousConnectionError(_refused(where, "no", "a"))
        if _attempt(ip, port, None, _REFUSAL_WINDOW * 2) == "ok":
            raise RendezvousConnectionError(_refused(where, "a", "no"))
        raise RendezvousConnectionError(
            f"the rendezvous store at {where} refused this agent's world secret: the "
            "DISTGRAD_WORLD_SECRET (or DISTGRAD_WORLD_SECRET_FILE) of this host differs from "
            "the one of the store's host; every node needs the same secret")
    raise RendezvousConnectionError(
        f"nothing answers at the rendezvous store {where} after {timeout:g} s ({outcome}): is "
        "the agent that serves it running (node 0 with the static rendezvous, the agent on "
        "the endpoint's host with c10d), and do --master-addr/--master-port (or "
        "--rdzv-endpoint) name it on every node?")


def _attempt(ip, port, keys, timeout):
    """"ok" (a handshake succeeded), "refused" (handshakes fail) or why nothing answered
    within ``timeout`` s."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.ipv6 = ":" in ip
    if keys is not None:
        sock.curve_serverkey = sock.curve_publickey = keys[0]
        sock.curve_secretkey = keys[1]
    monitor = sock.get_monitor_socket(_PROBE_EVENTS)
    try:
        sock.connect(addresses.endpoint(ip, port))
        deadline = time.monotonic() + timeout
        connected, refusals, first_refusal = False, 0, None
        while time.monotonic() < deadline:
            left = deadline - time.monotonic()
            if not monitor.poll(int(min(left, 0.5) * 1000) + 1):
                continue
            kind, value = recv_monitor_event(monitor)
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return "ok"
            if kind == zmq.EVENT_CONNECTED:
                connected = True
            elif kind & _HANDSHAKE_FAILED:
                refusals += 1
                first_refusal = first_refusal or time.monotonic()
                if value == _MECHANISM_MISMATCH or refusals >= _REFUSALS \
                        and time.monotonic() - first_refusal >= _REFUSAL_WINDOW:
                    return "refused"
        if refusals:
            return "refused"
        return ("it accepted the connection but never completed the handshake"
                if connected else _connect_error(ip, port))
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def _refused(where, mine, theirs):
    return (f"the rendezvous store at {where} refused this agent: this host has {mine} world "
            f"secret and the store's host {theirs} secret; set the same DISTGRAD_WORLD_SECRET "
            "(or DISTGRAD_WORLD_SECRET_FILE) on every node, or on none")


def _connect_error(ip, port):
    """Why a plain TCP connection to ``ip:port`` fails now (for the message)."""
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return "it accepts connections but did not answer as a store"
    except OSError as e:
        return e.strerror or type(e).__name__
