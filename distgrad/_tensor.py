"""``distgrad.Tensor``: the one Tensor class, assembled here from the layers that give it
its methods (as PyTorch's ``torch/_tensor.py`` builds ``Tensor`` on ``TensorBase``).

What a Tensor can do is the union of its bases, each a class in its own module:

================================  =====================================================
``autograd/tensor.py``            ``TensorBase``: the array, ``requires_grad``, ``.grad``,
                                  ``grad_fn``, hooks, versions, views, ``item``/``numpy``
``ops/methods.py``                ``TensorMethods``: math, reductions, shapes, indexing,
                                  operators, in-place forms, conversions (one table)
``sparse/functions.py``           ``SparseMethods``: ``is_sparse``, ``layout``,
                                  ``to_sparse``/``to_dense`` and COO accessors
``multiprocessing/sharing.py``    ``SharingMethods``: ``share_memory_``, ``is_shared``,
                                  pickling for :mod:`multiprocessing`
this module                       ``backward``, ``retain_grad``, ``__repr__``, ``__format__``
================================  =====================================================

No module adds to the class after it is made. Autograd makes every tensor of this class
(:func:`~distgrad.autograd.tensor.install_tensor_type`).

>>> import distgrad
>>> x = distgrad.tensor([1.0, 2.0], requires_grad=True)
>>> type(x) is Tensor, f"{(x * x).sum():.1f}"
(True, '5.0')
"""
from ._tensor_str import prints_as_tensor, tensor_repr
from .autograd._internal import TensorBase, array_of, grad_edge, install_tensor_type, retain_grad
from .autograd.engine import backward as _backward
from .multiprocessing.sharing import SharingMethods
from .ops.methods import TensorMethods
from .sparse.functions import SparseMethods

__all__ = ["Tensor"]


@prints_as_tensor
class Tensor(TensorBase, TensorMethods, SparseMethods, SharingMethods):
    # TensorBase first: its identity __hash__ stands before TensorMethods' (None, as a class
    # that defines __eq__ gets), so tensors stay hashable by identity, as PyTorch's.
    __slots__ = ()

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate the gradient of this tensor w.r.t. the graph leaves into their ``.grad``."""
        _backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    retain_grad = retain_grad
    _grad_edge = grad_edge  # the (node, input_nr) edge a consumer of this tensor points to
    __repr__ = tensor_repr

    def __format__(self, format_spec):
        # As PyTorch: a 0-d tensor formats as its number (f"{loss:.4f}"); anything else,
        # and a subclass, takes object's rule (str() for an empty spec, TypeError otherwise).
        data = array_of(self)
        if data.ndim == 0 and type(self) is Tensor:
            return data.item().__format__(format_spec)
        return object.__format__(self, format_spec)


install_tensor_type(Tensor)
