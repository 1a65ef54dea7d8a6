"""einsum with gradients: the VJP of operand k is itself an einsum.

For ``out = einsum("a,b,...->o", A, B, ...)``, the gradient of ``A`` is
``einsum("o,b,...->a", g, B, ...)``, then broadcast along indices that only ``A``
has (they were summed away and every position got the same gradient). Repeated
indices inside one operand (diagonals, ``"ii->i"``) are refused with a clear error.
"""
import string

import numpy as np

from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, wrap, defop, record

__all__ = ["einsum"]


def _parse(equation, shapes):
    """Explicit form: a list of input subscripts and the output, ellipses spelled out."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(shapes):
        raise ValueError(f"einsum(): {len(inputs)} subscripts for {len(shapes)} operands in "
                         f"{equation!r}")
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in string.ascii_letters if c not in used]
    ell_len = max((len(s) - (len(sub) - 3) for sub, s in zip(inputs, shapes) if "..." in sub),
                  default=0)
    ell = "".join(spare[:ell_len])
    explicit = []
    for sub, shape in zip(inputs, shapes):
        if "..." in sub:
            n = len(shape) - (len(sub) - 3)
            sub = sub.replace("...", ell[ell_len - n:] if n else "")
        if len(sub) != len(shape):
            raise RuntimeError(f"einsum(): the number of subscripts in {sub!r} does not match the "
                               f"number of dimensions ({len(shape)}) of its operand")
        explicit.append(sub)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {}
        for sub in explicit:
            for c in sub:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    for sub in explicit:
        if len(set(sub)) != len(sub):
            raise NotImplementedError(f"einsum(): repeated subscripts within one operand ({sub!r}) "
                                      "are not supported by distgrad")
    return explicit, out


def _einsum_vjp_all(xp, grads, m, needs, *operands):
    g = grads[0]
    subs, out = m["subs"], m["out"]
    results = []
    for k, need in enumerate(needs):
        if not need:
            results.append(None)
            continue
        others = [(s, op) for i, (s, op) in enumerate(zip(subs, operands)) if i != k]
        target = subs[k]
        present = set(out).union(*[set(s) for s, _ in others])
        kept = "".join(c for c in target if c in present)
        eq = ",".join([out] + [s for s, _ in others]) + "->" + kept
        gk = xp.einsum(eq, g, *[xp.conj(op) for _, op in others])
        if kept != target:  # indices only this operand had: same gradient all along them
            shape = m["shapes"][k]
            gk = xp.broadcast_to(xp.reshape(gk, tuple(
                shape[i] if c in present else 1 for i, c in enumerate(target))), shape)
        results.append(gk)
    return tuple(results)


# The operands are saved positionally: grad_fn._saved_operand0, _saved_operand1, ...
EinsumBackward0 = defop("EinsumBackward0", saved=tuple(f"operand{i}" for i in range(52)),
                        vjp_all=_einsum_vjp_all)


def einsum(equation, *operands):
    """``einsum("bij,bjk->bik", a, b)``, as ``torch.einsum``."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    tensors = [op if isinstance(op, TensorBase) else wrap(np.asarray(op)) for op in operands]
    subs, out = _parse(equation, [array_of(t).shape for t in tensors])
    result = np.einsum(",".join(subs) + "->" + out, *[array_of(t) for t in tensors], optimize=True)
    return record(EinsumBackward0, np.asarray(result), tuple(tensors), tuple(tensors),
                  {"subs": subs, "out": out, "shapes": [array_of(t).shape for t in tensors]})
