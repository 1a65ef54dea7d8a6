"""``torch.layout``: how a tensor's elements are stored (``strided`` or ``sparse_coo``)."""
from distgrad.autograd.naming import public_name

__all__ = ["layout", "strided", "sparse_coo"]


class layout:  # noqa: N801 - PyTorch's name
    """A storage layout; compares by identity, prints as ``distgrad.sparse_coo``."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"{public_name()}.{self.name}"

    def __reduce__(self):  # singletons, through copy and deepcopy too
        return (_by_name, (self.name,))


strided = layout("strided")
sparse_coo = layout("sparse_coo")


def _by_name(name):
    return {"strided": strided, "sparse_coo": sparse_coo}[name]
