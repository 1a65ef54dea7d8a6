"""Where a process's world secret comes from, and what it hands to the members it starts.

A world's secret is made by whoever forms the world and handed to its members the way
they receive the rendezvous address (Jupyter's connection files, DESIGN.md): the
launcher and ``distgrad.distributed.run`` put it in their children's environment
(``DISTGRAD_WORLD_SECRET``), as torchrun hands ``MASTER_ADDR``; a
``distgrad.multiprocessing.spawn`` parent makes one and its children inherit it.
What checks it is ``rpc/credentials.py``; this module only knows where it is, so that
the layers that start processes need not import the RPC layer.

A process that starts members keeps the secret it made (:func:`for_children`), so that a
world it joins itself after starting them (``start_processes(join=False)`` and then
``init_rpc`` as rank 0) is the same world. A process that is already a member of a
world formed without a secret hands none: its children may be joining that world, which
would refuse them.
"""
import os
import secrets
import threading

__all__ = ["SECRET_ENV", "REQUIRE_ENV", "new_world_secret", "current", "for_children",
           "required", "joined_without_secret"]

#: The environment variable through which a world's members receive its secret.
SECRET_ENV = "DISTGRAD_WORLD_SECRET"
#: Set to 1 to refuse forming or joining a world without a secret.
REQUIRE_ENV = "DISTGRAD_REQUIRE_SECRET"

_lock = threading.Lock()
_made = None            # the secret this process made for the members it started
_without = False        # this process joined a world that had no secret


def new_world_secret():
    """A fresh world secret (text), for whoever forms a world."""
    return secrets.token_hex(32)


def current():
    """This process's world secret (text): ``DISTGRAD_WORLD_SECRET``, else the one it made
    for the members it started; None if it has neither."""
    return os.environ.get(SECRET_ENV) or _made


def for_children():
    """The secret to hand to processes this one starts as members of a world (made now if
    there is none), or None while this process is itself a member of a world without one."""
    global _made
    with _lock:
        secret = current()
        if secret is None and not _without:
            secret = _made = new_world_secret()
        return secret


def required():
    """Whether ``DISTGRAD_REQUIRE_SECRET`` asks to refuse worlds without a secret."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def joined_without_secret():
    """Note that this process is a member of a world without a secret (see module doc)."""
    global _without
    with _lock:
        _without = True
