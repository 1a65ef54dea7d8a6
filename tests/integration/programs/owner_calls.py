"""Helpers the RPC programs share for calling a method of the object an ``RRef`` holds, on
the process that owns it (the usual companion of ``rpc.remote``): the method and the RRef
travel, and the owner calls ``method(rref.local_value(), *args)``. Plain PyTorch."""
import torch.distributed.rpc as rpc


def on_value(method, rref, *args):
    """Runs on the owner of ``rref``."""
    return method(rref.local_value(), *args)


def sync_on_owner(method, rref, *args):
    return rpc.rpc_sync(rref.owner(), on_value, args=(method, rref) + args)


def async_on_owner(method, rref, *args):
    return rpc.rpc_async(rref.owner(), on_value, args=(method, rref) + args)


def remote_on_owner(method, rref, *args):
    """An RRef of the result, which stays on the owner."""
    return rpc.remote(rref.owner(), on_value, args=(method, rref) + args)


def parameter_rrefs(module):
    """An RRef for each parameter of a module of this process."""
    return [rpc.RRef(p) for p in module.parameters()]
