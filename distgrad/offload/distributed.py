"""Activation offloading in a distributed pass: each worker offloads its own graph segment.

The coordinator sends each worker an offload table (the ``hooks_from_config``
format) for one autograd context; every request a worker serves in that
context records its segment under the resulting hook object, the worker starts
reading ahead as soon as the coordinator's backward starts (not when its first
gradient arrives), and releasing the context frees whatever is left there.

    from distgrad.offload.distributed import register_offload
    with dist_autograd.context() as cid:
        register_offload(cid, {"kind": "disk", "policy": {"min_bytes": 65536}},
                         workers=["worker1"])
        loss = stage2(stage1(x)).sum()
        dist_autograd.backward(cid, [loss])

Workers write files for it, so they must allow this module explicitly
(``distgrad worker --allow distgrad.offload.distributed``, or
``RpcBackendOptions(allowed_modules=[...])``): it is not a default entry point.
"""
from distgrad.distributed.autograd import hooks as _dist_hooks
from distgrad.distributed.autograd.container import add_extension, my_name

from .config import check_config, hooks_from_config

__all__ = ["register_offload"]


def register_offload(context_id, config, workers=None):
    """Offload the graph segments of ``context_id`` on ``workers`` (default: all) as ``config``
    (a dict in the ``[offload]`` table format; validated here first)."""
    check_config(config, "register_offload config")
    _dist_hooks.install_on_workers(context_id, _install, (dict(config),), workers)


def _install(context_id, config):
    """Runs on a worker: the hook object for this context, attached to it."""
    hooks = hooks_from_config(config, f"offload config of worker {my_name()!r}",
                              namespace=context_id)
    if hooks is not None:
        add_extension(context_id, hooks)
    return hooks is not None
