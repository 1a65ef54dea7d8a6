"""How the stages of one rank reach the stages of other ranks: messages by key.

A key is ``(kind, stage, micro-batch)``: the activation ``"act"`` stage ``stage`` takes as
input, the gradient ``"grad"`` of its outputs, or ``"hello"`` (the neighbours' first
handshake of a schedule). A value is what the codec carries (a list of arrays, of any
shapes). The schedule posts every receive of a step before it computes anything and
sends as soon as a value is ready, so sends never wait for the peer and nothing
deadlocks whatever the order of the ranks' actions.

:class:`ProcessGroupChannel` is the one of ``PipelineStage``: a process group's
point-to-point messages, a tag per key. ``distgrad launch`` gives its stages one over
RPC (:mod:`distgrad.launch.stage`), with the same three methods.
"""
from distgrad.distributed.point_to_point import irecv_value, isend_value
from distgrad.distributed.process_group import get_rank, get_world_size

__all__ = ["ProcessGroupChannel", "KINDS"]

#: message kinds and their codes in tags
KINDS = {"act": 1, "grad": 2, "hello": 3}
# far above the tags programs use, so a pipeline's messages never meet theirs
_TAG_BASE = 0x7A11 << 40


def tag_of(key):
    kind, stage, mb = key
    return _TAG_BASE + ((KINDS[kind] << 16 | stage) << 22) + mb


class ProcessGroupChannel:
    """Messages between the ranks of ``group`` (None: the default group)."""

    def __init__(self, group=None):
        self.group = group
        self.rank = get_rank(group)
        self.size = get_world_size(group)

    def post(self, key, peer):
        """Start receiving ``key`` from group rank ``peer``; a handle for :meth:`take`."""
        return irecv_value(group=self.group, tag=tag_of(key), group_src=peer)

    def send(self, key, peer, value):
        isend_value(value, group=self.group, tag=tag_of(key), group_dst=peer)

    def take(self, handle, key, peer):
        """The value of a posted receive, once it is here (bounded by the group's timeout)."""
        handle.wait()
        return handle.result()[0]
