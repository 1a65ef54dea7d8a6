"""Who may talk to a world: each process's own credential and the world's secret (the
ZAP answers that admit a connection as one rank of the world are in ``admission.py``).

Connections are authenticated, not messages: once ZeroMQ's handshake admitted a
connection (ZAP, RFC 27), every message on it carries the rank it was admitted as
(its ``User-Id``), and the transport refuses a message whose header claims another
rank. Large tensors pay nothing per byte.

Each process makes its own credential when it starts (:class:`Credential`) and
registers only what checks it (its *verifier*) at the rendezvous, which hands the
table of verifiers to every member. Two mechanisms:

``plain`` (the default): a random 32-byte token per process, presented with ZeroMQ's
    PLAIN mechanism; peers hold its SHA-256 only, so no member can present another
    member's token. The token crosses the network in the clear at each handshake:
    right on one host or a network nobody else can read, not on an untrusted one.
``curve``: a CURVE key pair per process (when the options carry the world's CURVE key
    pair, which also encrypts the rendezvous); the connection is encrypted and the
    secret key never leaves its process. What it costs: every byte is encrypted.

The world's secret (``DISTGRAD_WORLD_SECRET`` or ``RpcBackendOptions.world_secret``),
made by whoever forms the world and handed to its members as the rendezvous address
is (``utils/world_secret.py``), never crosses the wire: a registration proves it holds
the secret with an HMAC over its own content, and the rendezvous proves the same over
the table it answers with. A world without a secret is still closed once it formed (no
connection is admitted without a registered credential), but while it forms anyone who
reaches the rendezvous may register (a rank claimed twice abandons the world): its rank 0
warns once it formed (:func:`warn_open_world`; not where only this host can reach it),
and every member refuses it with ``DISTGRAD_REQUIRE_SECRET=1``.
"""
import hashlib
import hmac
import os
import secrets
import sys
import warnings

import msgpack
import zmq

from ..utils.addresses import reached_from_this_host_only
from ..utils.world_secret import (REQUIRE_ENV, SECRET_ENV, current, joined_without_secret,
                                  new_world_secret, required)
from .errors import RpcError

__all__ = ["SECRET_ENV", "REQUIRE_ENV", "MECHANISMS", "Credential", "world_secret",
           "member_secret", "warn_open_world", "new_world_secret", "prove", "proven"]

#: How a connection is authenticated; "none" only when authentication is turned off.
MECHANISMS = ("none", "plain", "curve")

def world_secret(options):
    """The world secret of ``options`` or of this process (its environment, or the one it
    made for members it started), as bytes (None: no secret)."""
    s = getattr(options, "world_secret", None) or current()
    return s.encode() if isinstance(s, str) else s


_HOW = (f"give every process of the world the same {SECRET_ENV} (python -c \"import secrets; "
        "print(secrets.token_hex(32))\"), or start the world with `distgrad launch`, `python -m "
        "distgrad.distributed.run` or distgrad.multiprocessing.spawn, which make one")


def member_secret(options, who, world_size, secret=None, error=RpcError):
    """The secret ``who`` joins its world with (bytes): :func:`world_secret`, else ``secret``
    (found elsewhere: a ``file://`` rendezvous file hands one). Without one it raises
    ``error`` (:class:`RpcError`) under ``DISTGRAD_REQUIRE_SECRET=1``, else returns None:
    PyTorch's users start ranks by hand, and such worlds keep working, but not silently
    (rank 0 says so once the world formed: :func:`warn_open_world`)."""
    secret = world_secret(options) or secret
    if secret is not None:
        return secret
    if required():
        raise error(f"{who} has no world secret and {REQUIRE_ENV} is set: {_HOW}")
    joined_without_secret()
    return None


def warn_open_world(who, world_size, meeting, endpoints, mechanism):
    """Rank 0 (``who``) of a world of ``world_size`` that formed without a secret warns,
    once for the world, that anyone who reached it while it formed could have joined:
    unless nobody else can join anyway (a world of one, authentication off) or every
    address it was reached at (``meeting``: where the ranks met, a rendezvous or a store,
    None if not known; the members' ``endpoints``) is this host's loopback or an ipc
    path, where only processes of this host reach it."""
    if mechanism == "none" or world_size <= 1:
        return
    if all(reached_from_this_host_only(a) for a in (meeting, *endpoints)):
        return
    where = f" at {meeting}" if meeting else ""
    warnings.warn(f"{who} formed a world of {world_size} processes without a secret: while "
                  f"it formed, any process that reached it{where} could have joined it as a "
                  f"member. To close it, {_HOW}; {REQUIRE_ENV}=1 makes this an error.",
                  UserWarning, stacklevel=_first_caller_outside())


def _first_caller_outside():
    """The ``stacklevel`` of the caller's first frame outside distgrad: the program's call
    that formed the world (``init_rpc``, ``init_process_group``)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def prove(secret, what, content):
    """HMAC of ``content`` (msgpack-able) under ``secret``, labelled ``what``: what shows a
    registration or a table came from a holder of the secret."""
    return hmac.new(secret, what.encode() + b"\0" + msgpack.packb(content),
                    hashlib.sha256).hexdigest()


def proven(secret, what, content, proof):
    return type(proof) is str and hmac.compare_digest(prove(secret, what, content), proof)


class Credential:
    """This process's credential for one world. ``verifier`` is what its peers check (and
    all they learn): the token's SHA-256 (plain) or the public key (curve)."""

    def __init__(self, mechanism):
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown authentication mechanism {mechanism!r}")
        self.mechanism = mechanism
        self.verifier = None
        if mechanism == "plain":
            self._token = secrets.token_hex(32).encode()
            self.verifier = hashlib.sha256(self._token).hexdigest()
        elif mechanism == "curve":
            self._public, self._secret = zmq.curve_keypair()
            self.verifier = self._public.decode()

    @property
    def registration(self):
        """What the rendezvous learns and hands to the members: [mechanism, verifier]."""
        return [self.mechanism, self.verifier]

    def serve(self, sock):
        """Make ``sock`` (a bound ROUTER) admit only connections the ZAP handler admits."""
        if self.mechanism == "plain":
            sock.plain_server = True
        elif self.mechanism == "curve":
            sock.curve_server = True
            sock.curve_publickey, sock.curve_secretkey = self._public, self._secret

    def client_options(self, rank, peer_verifier):
        """Socket options that make a client socket present this credential as ``rank`` to
        the peer whose verifier is ``peer_verifier``."""
        if self.mechanism == "plain":
            return {"plain_username": b"%d" % rank, "plain_password": self._token}
        if self.mechanism == "curve":
            return {"curve_serverkey": peer_verifier.encode(), "curve_publickey": self._public,
                    "curve_secretkey": self._secret}
        return {}
