"""``distgrad.save`` / ``distgrad.load``: checkpoints on local files, as ``torch.save``.

Local files only: pickle is fine for a file the user wrote themselves, and never
used for anything that arrives over a socket (see ``distgrad/rpc``). ``load``
defaults to ``weights_only=True`` like recent PyTorch: only tensors, containers
and plain values are accepted, through a restricted unpickler.
"""
import io
import pickle

__all__ = ["save", "load"]

_SAFE = {
    ("collections", "OrderedDict"), ("builtins", "dict"), ("builtins", "list"),
    ("builtins", "tuple"), ("builtins", "set"), ("builtins", "frozenset"),
    ("builtins", "complex"), ("distgrad.autograd.tensor", "_rebuild"),
    ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("distgrad.autograd.dtype", "from_numpy_dtype"),
}


class _WeightsUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _SAFE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"Weights only load failed: {module}.{name} is not an allowed global. Pass "
            "weights_only=False only for a file you trust.")


def save(obj, f, pickle_protocol=pickle.DEFAULT_PROTOCOL):
    """Write ``obj`` (a state_dict, tensors, containers) to a path or a binary file."""
    if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
        with open(f, "wb") as fh:
            pickle.dump(obj, fh, protocol=pickle_protocol)
    else:
        pickle.dump(obj, f, protocol=pickle_protocol)


def load(f, map_location=None, weights_only=True):
    """Read what :func:`save` wrote; ``weights_only=True`` refuses arbitrary objects."""
    if isinstance(f, (str, bytes)) or hasattr(f, "__fspath__"):
        with open(f, "rb") as fh:
            data = fh.read()
    else:
        data = f.read()
    if weights_only:
        return _WeightsUnpickler(io.BytesIO(data)).load()
    return pickle.loads(data)  # noqa: S301 - explicitly requested for a trusted local file


