"""Where a process's world secret comes from, and what it hands to the members it starts.

A world's secret is made by whoever forms the world and handed to its members the way
they receive the rendezvous address (Jupyter's connection files, DESIGN.md): the
launcher and ``distgrad.distributed.run`` put it in their children's environment
(``DISTGRAD_WORLD_SECRET``), as torchrun hands ``MASTER_ADDR``; a
``distgrad.multiprocessing.spawn`` parent makes one and its children inherit it.
What checks it is ``rpc/credentials.py``; this module only knows where it is, so that
the layers that start processes need not import the RPC layer.

Where members start on several hosts, nobody hands the secret over with the address: the
user gives the same one to every host, in ``DISTGRAD_WORLD_SECRET`` or in a file only its
owner can read, named by ``DISTGRAD_WORLD_SECRET_FILE`` (a file that others may read, or
that another user owns, is refused by name: the secret would not be one).

A process that starts members keeps the secret it made (:func:`for_children`), so that a
world it joins itself after starting them (``start_processes(join=False)`` and then
``init_rpc`` as rank 0) is the same world. A process that is already a member of a
world formed without a secret hands none: its children may be joining that world, which
would refuse them.
"""
import os
import secrets
import threading

__all__ = ["SECRET_ENV", "SECRET_FILE_ENV", "REQUIRE_ENV", "new_world_secret", "current",
           "from_file", "for_children", "required", "joined_without_secret"]

#: The environment variable through which a world's members receive its secret.
SECRET_ENV = "DISTGRAD_WORLD_SECRET"
#: A file holding the secret (readable by its owner only), where no variable carries it.
SECRET_FILE_ENV = "DISTGRAD_WORLD_SECRET_FILE"
#: Set to 1 to refuse forming or joining a world without a secret.
REQUIRE_ENV = "DISTGRAD_REQUIRE_SECRET"

_lock = threading.Lock()
_made = None            # the secret this process made for the members it started
_without = False        # this process joined a world that had no secret


def new_world_secret():
    """A fresh world secret (text), for whoever forms a world."""
    return secrets.token_hex(32)


def current():
    """This process's world secret (text): ``DISTGRAD_WORLD_SECRET``, else the file named by
    ``DISTGRAD_WORLD_SECRET_FILE``, else the one it made for the members it started; None
    if it has none of them."""
    return os.environ.get(SECRET_ENV) or from_file() or _made


def from_file(path=None):
    """The secret in ``path`` (default: ``DISTGRAD_WORLD_SECRET_FILE``; None if unset).
    Raises :class:`PermissionError` if others may read the file or another user owns it,
    :class:`ValueError` if it is empty, naming the file."""
    path = path or os.environ.get(SECRET_FILE_ENV)
    if not path:
        return None
    try:
        st = os.stat(path)
        with open(path) as fh:
            secret = fh.read().strip()
    except OSError as e:
        raise OSError(e.errno, f"{SECRET_FILE_ENV}={path}: cannot read the world secret: "
                               f"{e.strerror}") from None
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{SECRET_FILE_ENV}={path} belongs to uid {st.st_uid}, not to "
                              f"this process's user ({os.geteuid()}): a secret file must be "
                              "its user's own")
    if st.st_mode & 0o077:
        raise PermissionError(f"{SECRET_FILE_ENV}={path} can be read by others (mode "
                              f"{st.st_mode & 0o777:o}): make it its owner's only "
                              f"(chmod 600 {path})")
    if not secret:
        raise ValueError(f"{SECRET_FILE_ENV}={path} is empty")
    return secret


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
