"""Who belongs to a process-group world: each rank's entry in the store, written and checked.

A process group authenticates its connections as an RPC world does (``rpc/credentials.py``):
each rank makes a credential of its own and publishes, beside its endpoint, only what
checks it (its verifier); every rank's transport then admits only connections that
present a credential of the table, each as the rank it published, and refuses a message
whose source is not its connection's. With a world secret (``DISTGRAD_WORLD_SECRET``,
made by whoever starts the world) an entry proves its writer holds it (an HMAC over the
entry, the secret never in the store), so a process without the secret that reaches the
store while the world forms cannot slip its own entry in: the ranks refuse it, naming
it. A private ``FileStore`` needs no secret (only its owner can write the file); a store
on a socket without one is closed once the world formed, and its rank 0 says so once
(:func:`warn_if_open`, as ``init_rpc``'s does; not where only this host reaches it);
``DISTGRAD_REQUIRE_SECRET=1`` makes it an error on every rank.
"""
import msgpack

from distgrad.rpc.credentials import (SECRET_ENV, member_secret, prove, proven,
                                      warn_open_world, world_secret)
from distgrad.utils import file_table

from .errors import DistError

__all__ = ["secret_for", "entry", "admitted", "warn_if_open"]

_WHAT = "process group member"


def secret_for(options, store, rank, world_size):
    """The world secret rank ``rank`` publishes its entry with (bytes or None). A private
    file store's ranks need none; others warn or raise without one (see module doc)."""
    path = getattr(store, "path", None)
    if path is not None and file_table.is_private(path):
        return world_secret(options)  # the file's owner alone writes entries: none needed
    return member_secret(options, f"process group rank {rank}", world_size, error=DistError)


def warn_if_open(options, store, rank, world_size, secret, endpoints):
    """Rank 0 of a process group that formed without a secret says so, once
    (``credentials.warn_open_world``), unless its store is a private file. Where the ranks
    met is the address ``store`` listens on when this process serves it (else not known);
    ``endpoints`` are the ranks'."""
    path = getattr(store, "path", None)
    if rank != 0 or secret is not None or (path is not None and file_table.is_private(path)):
        return
    # an entry's endpoint names the addresses it listens on, then what identifies its host
    listening = [a for ep in endpoints for a in ep.split() if "://" in a]
    warn_open_world("process group rank 0", world_size, getattr(store, "served_at", None),
                    listening, options.mechanism)


def entry(rank, world_size, endpoint, verifier, secret):
    """What rank ``rank`` publishes: its endpoint, its verifier and, with ``secret``, the
    proof that it holds it."""
    content = [rank, world_size, endpoint, verifier]
    proof = prove(secret, _WHAT, content) if secret is not None else None
    return msgpack.packb([endpoint, verifier, proof])


def admitted(entries, world_size, secret):
    """(endpoints, verifiers) of the ranks whose ``entries`` (bytes, by rank) are sound and,
    with ``secret``, proven; raises :class:`DistError` naming the first that is not."""
    endpoints, verifiers = [], []
    for rank, raw in enumerate(entries):
        try:
            endpoint, verifier, proof = msgpack.unpackb(raw, raw=False)
            if type(endpoint) is not str or not (verifier is None or type(verifier) is str):
                raise ValueError("malformed")
        except Exception:  # noqa: BLE001 - whatever a process wrote into the store
            raise DistError(f"the store's entry for rank {rank} of the process group is "
                            "malformed: a process that is not of this world wrote it, or "
                            "another version of distgrad") from None
        if secret is not None and not proven(secret, _WHAT,
                                             [rank, world_size, endpoint, verifier], proof):
            raise DistError(f"the store's entry for rank {rank} of the process group does not "
                            f"prove the world secret: rank {rank} has another "
                            f"{SECRET_ENV} (or none), or a process that is not of this world "
                            "wrote it")
        endpoints.append(endpoint)
        verifiers.append(verifier)
    return endpoints, verifiers
