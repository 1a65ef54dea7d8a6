"""Functions the checkpointing tests run on RPC workers: stages whose forward is
checkpointed and makes RPCs of its own, so the recomputation in backward makes them again.
Parameters come from ``dist_funcs``' per-process store (``make_params``)."""
import distgrad
from distgrad.rpc import api
from distgrad.utils.checkpoint import checkpoint

from support import dist_funcs

_calls = {"stage": 0}


def calls():
    """How often ``counted_stage`` ran in this process (forward and recomputations)."""
    return _calls["stage"]


def counted_stage(key, x):
    _calls["stage"] += 1
    return dist_funcs.stage(key, x)


def remote_then_local(x, where, key_remote, key_local):
    """A stage on ``where`` (an RPC), then one here, then a product of both."""
    h = api.rpc_sync(where, counted_stage, (key_remote, x))
    return dist_funcs.stage(key_local, h) * h


def checkpointed_remote_then_local(x, where, key_remote, key_local, reentrant=False):
    """``remote_then_local`` checkpointed on this worker: its backward here reruns it,
    RPC to ``where`` included."""
    return checkpoint(remote_then_local, x, where, key_remote, key_local,
                      use_reentrant=reentrant)
