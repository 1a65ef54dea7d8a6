"""``torch.distributed.rpc.functions``: ``async_execution``."""


def async_execution(fn):
    """Mark ``fn`` as returning a Future: the reply is sent when that Future completes,
    without holding a handler thread meanwhile."""
    fn._distgrad_async_execution = True
    return fn
