"""WorkerInfo: a worker's name and rank, as in ``torch.distributed.rpc.WorkerInfo``."""
from .. import codec


class WorkerInfo:
    __slots__ = ("name", "id")

    def __init__(self, name, id):
        self.name = name
        self.id = id

    def __eq__(self, other):
        return isinstance(other, WorkerInfo) and (self.name, self.id) == (other.name, other.id)

    def __hash__(self):
        return hash((self.name, self.id))

    def __repr__(self):
        return f"WorkerInfo(id={self.id}, name={self.name})"


def _decode(payload, dec):
    name, wid = payload
    return WorkerInfo(name, wid)


codec.register(WorkerInfo, 8, lambda w, enc: [w.name, w.id], _decode)
