"""TensorBoard logging with ``torch.utils.tensorboard``'s API: ``SummaryWriter``.

It writes TensorBoard's event files through the ``tensorboard`` package, an optional
dependency as it is PyTorch's (``pip install 'distgrad[tensorboard]'``): importing this
module without it raises ModuleNotFoundError saying so; ``import distgrad`` never
imports it.
"""
try:
    import tensorboard
except ImportError as e:
    raise ModuleNotFoundError(
        "distgrad.utils.tensorboard needs the tensorboard package, which is not installed: "
        "pip install 'distgrad[tensorboard]' (or pip install tensorboard)",
        name="tensorboard") from e

if getattr(tensorboard, "__file__", None) is None:
    # A directory named tensorboard on sys.path (a log directory in the working directory,
    # a test folder) imports as an empty namespace package: that is not the package.
    raise ModuleNotFoundError(
        "distgrad.utils.tensorboard needs the tensorboard package, which is not installed: "
        f"'import tensorboard' found only the directory {list(tensorboard.__path__)}, "
        "not the package; pip install 'distgrad[tensorboard]' (or pip install tensorboard)",
        name="tensorboard")


def _version(text):
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


if not hasattr(tensorboard, "__version__") or _version(tensorboard.__version__) < (1, 15):
    raise ImportError("TensorBoard logging requires TensorBoard version 1.15 or above")

del tensorboard

from .writer import FileWriter, SummaryWriter  # noqa: E402 - after the check above

__all__ = ["FileWriter", "SummaryWriter"]
