"""The name distgrad's reprs give the library: ``distgrad``, or ``torch`` under as_torch.

A PyTorch program run unchanged (``python -m distgrad.compat.as_torch``) that prints a
dtype or a shape, or compares ``str(t.dtype)`` with ``"torch.float32"``, sees what PyTorch
would print. ``distgrad.compat.as_torch.install`` switches it.

>>> public_name()
'distgrad'
"""
__all__ = ["public_name", "set_public_name"]

_name = ["distgrad"]


def public_name():
    return _name[0]


def set_public_name(name):
    _name[0] = name
