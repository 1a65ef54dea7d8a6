"""The version distgrad reports as ``torch`` under :mod:`distgrad.compat.as_torch`, and the
``torch.version`` / ``torch.torch_version`` modules it stands in for.

Which version, and why: :data:`TORCH_RELEASE` is the PyTorch release whose
documented behaviour distgrad follows and whose test suite oracle it is checked
against (the ``torch==`` pin of the CI; ``tests/compat`` fails when the two part).
Libraries gate features on ``torch.__version__``; reporting that release sends
them down the modern paths distgrad implements (``torch.load(weights_only=...)``,
``torch.compile``, ``torch.accelerator``), where an older number would send them to
legacy code distgrad never had. The local label ``+distgrad.X.Y.Z`` (PEP 440, as
PyTorch's own ``+cpu``) says what is really running; release comparisons ignore it.

>>> v = TorchVersion(f"{TORCH_RELEASE}+distgrad.0.1.0")
>>> v >= "2.0", v > (2, 0), v < "100.0"
(True, True, True)
"""
import re

__all__ = ["TorchVersion", "TORCH_RELEASE", "__version__", "cuda", "hip", "rocm", "xpu",
           "debug", "git_version", "internal_version"]

#: The PyTorch release distgrad answers for (see the module's doc).
TORCH_RELEASE = "2.13.0"

_PATTERN = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|rc|alpha|beta|c)[-_.]?(\d*))?"
                      r"(?:[-_.]?post[-_.]?(\d*))?(?:[-_.]?dev[-_.]?(\d*))?(?:\+([a-z0-9.]*))?$",
                      re.IGNORECASE)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}


def _key(text):
    """A sort key of a PEP 440 version: release, pre, post, dev, then the local label (a
    local version sorts after its public one, as in ``packaging``)."""
    m = _PATTERN.match(text.strip())
    if m is None:
        raise ValueError(f"Invalid version: {text!r}")
    release, pre, pre_n, post, dev, local = m.groups()
    numbers = tuple(int(x) for x in release.split("."))
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers = numbers[:-1]
    # a dev release sorts before its pre-releases, which sort before the release
    pre_key = (_PRE[pre.lower()], int(pre_n or 0)) if pre else ((-1, 0) if dev is not None
                                                              and post is None else (3, 0))
    post_key = int(post or 0) if post is not None else -1
    dev_key = int(dev or 0) if dev is not None else float("inf")
    local_key = () if local is None else (1, local.lower())
    return numbers, pre_key, post_key, dev_key, local_key


def _other_key(other):
    if isinstance(other, tuple):
        return _key(".".join(str(x) for x in other))
    if isinstance(other, str):
        return _key(other)
    text = getattr(other, "public", None) or str(other)  # packaging's Version
    return _key(text)


class TorchVersion(str):
    """A version string that compares as a version with strings, tuples and ``Version`` s,
    as ``torch.torch_version.TorchVersion`` does (``torch.__version__ >= "2.0"``)."""

    def _compare(self, other, op):
        try:
            theirs = _other_key(other)
        except (ValueError, TypeError):
            return NotImplemented
        return op(_key(self), theirs)

    def __lt__(self, other):
        return self._compare(other, lambda a, b: a < b)

    def __le__(self, other):
        return self._compare(other, lambda a, b: a <= b)

    def __gt__(self, other):
        return self._compare(other, lambda a, b: a > b)

    def __ge__(self, other):
        return self._compare(other, lambda a, b: a >= b)

    def __eq__(self, other):
        if isinstance(other, str) and str.__eq__(self, other):
            return True
        result = self._compare(other, lambda a, b: a == b)
        return False if result is NotImplemented else result

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _distgrad_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("distgrad")
    except PackageNotFoundError:  # a checkout that was never installed
        return "0.1.0"


__version__ = TorchVersion(f"{TORCH_RELEASE}+distgrad.{_distgrad_version()}")
internal_version = __version__
cuda = None          # a CPU-only build, as torch's CPU wheels say
hip = None
rocm = None
xpu = None
debug = False
git_version = "distgrad"
