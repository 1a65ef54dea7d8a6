"""``LBFGS``, as ``torch.optim.LBFGS`` (with the optional strong-Wolfe line search).

The method is limited-memory BFGS: the search direction is the product of an
inverse-Hessian estimate, built from the last few curvature pairs ``(s, y)``, with
the negative gradient, computed by the two-loop recursion of Nocedal & Wright
(Numerical Optimization, 2nd ed., Algorithm 7.4). The optional line search looks
for a step that meets the strong Wolfe conditions: first widen an interval until it
must contain one, then shrink it by cubic interpolation (Algorithms 3.5 and 3.6).
Every decision (tolerances, the safeguards that keep trial steps away from an
interval's ends, what counts as an evaluation) is PyTorch's, so both libraries
take the same steps.

All parameters form one flat vector. Between steps the optimizer's memory lives
in the first parameter's state, as tensors, under PyTorch's keys (``d``, ``t``,
``old_dirs``, ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``, ``prev_loss``,
``al``, ``func_evals``, ``n_iter``), so a state dict loads into either library.
"""
from collections import namedtuple

import numpy as np

from .optimizer import Optimizer, _check_nonnegative
from ..autograd.grad_mode import enable_grad, no_grad
from .._tensor import Tensor
from ..autograd._internal import array_of, wrap, bump_version

__all__ = ["LBFGS"]

# Constants of the line search (PyTorch's; Nocedal & Wright suggest the same c1, c2).
_ARMIJO_C1 = 1e-4         # sufficient decrease
_CURVATURE_C2 = 0.9       # strong curvature condition
_MIN_BRACKET = 1e-9       # stop zooming once the interval is this narrow (in parameter units)
_MIN_CURVATURE = 1e-10    # a pair with s.y at or below this is not remembered

# A point tried along the search direction: step length, loss, flat gradient, and the
# directional derivative (gradient . direction) there.
_Probe = namedtuple("_Probe", "step loss grad slope")


def _cubic_step(a, b, lo=None, hi=None):
    """The minimiser of the cubic matching value and slope at probes ``a`` and ``b``,
    kept within ``[lo, hi]`` (by default the interval between them).

    With the probes ordered so that ``left.step <= right.step``, Nocedal & Wright's
    equation (3.59) reads: r = sqrt(d1^2 - g_l g_r) with d1 = g_l + g_r -
    3 (f_l - f_r) / (x_l - x_r), and the minimiser is
    x_r - (x_r - x_l) (g_r + r - d1) / (g_r - g_l + 2 r). If the cubic has no real
    turning point (negative radicand) the middle of the allowed interval is used.
    """
    left, right = (a, b) if a.step <= b.step else (b, a)
    if lo is None:
        lo, hi = left.step, right.step
    d1 = left.slope + right.slope - 3 * (left.loss - right.loss) / (left.step - right.step)
    radicand = d1 ** 2 - left.slope * right.slope
    if not radicand >= 0:  # (NaN included)
        return (lo + hi) / 2.0
    r = np.sqrt(radicand)
    x = right.step - (right.step - left.step) * (
        (right.slope + r - d1) / (right.slope - left.slope + 2 * r))
    return min(max(x, lo), hi)


class _WolfeSearch:
    """One strong-Wolfe line search from ``origin`` (a probe at step 0).

    ``evaluate(t)`` returns the probe at step ``t``. After :meth:`run`, ``best`` is the
    accepted probe and ``evaluations`` the number of calls to ``evaluate``.
    """

    def __init__(self, evaluate, origin, direction_scale, budget):
        self.evaluate = evaluate
        self.origin = origin
        self.scale = direction_scale  # the largest |component| of the direction
        self.budget = budget          # trial steps allowed after the first one
        self.trials = 0
        self.evaluations = 0

    def _try(self, t):
        self.evaluations += 1
        return self.evaluate(t)

    def _too_high(self, p):
        """Armijo's sufficient-decrease condition fails at ``p``."""
        return p.loss > self.origin.loss + _ARMIJO_C1 * p.step * self.origin.slope

    def _flat_enough(self, p):
        """The strong curvature condition holds at ``p``."""
        return abs(p.slope) <= -_CURVATURE_C2 * self.origin.slope

    def run(self, t):
        found, interval = self._bracket(self._try(t))
        if found is not None:
            return found
        return self._zoom(interval)

    def _bracket(self, current):
        """Grow the step until an interval surely holds an acceptable point (Algorithm 3.5).

        Returns ``(acceptable probe, None)`` or ``(None, [older, newer])``.
        """
        previous = self.origin
        while self.trials < self.budget:
            rose = self.trials > 1 and current.loss >= previous.loss
            if self._too_high(current) or rose:
                return None, [previous, current]
            if self._flat_enough(current):
                return current, None
            if current.slope >= 0:  # past a minimum along the line
                return None, [previous, current]
            # Still going down steeply: extrapolate, at least 1% beyond the current step
            # and at most ten times it.
            t = _cubic_step(previous, current, lo=current.step + 0.01 * (current.step
                                                                         - previous.step),
                            hi=current.step * 10)
            previous, current = current, self._try(t)
            self.trials += 1
        # Out of trials while extrapolating: keep the lower of the start and the last point.
        return (current if current.loss < self.origin.loss else self.origin), None

    def _zoom(self, interval):
        """Shrink ``interval`` until a point in it meets both conditions (Algorithm 3.6).

        ``interval[low]`` is always the lower of the two ends (the first on a tie).
        """
        low = 0 if interval[0].loss <= interval[1].loss else 1
        retreating = False  # the previous trial was too close to an end
        while self.trials < self.budget:
            a, b = interval
            if abs(b.step - a.step) * self.scale < _MIN_BRACKET:
                break
            t = _cubic_step(a, b)
            t, retreating = self._keep_inside(t, min(a.step, b.step), max(a.step, b.step),
                                              retreating)
            trial = self._try(t)
            self.trials += 1
            high = 1 - low
            if self._too_high(trial) or trial.loss >= interval[low].loss:
                interval[high] = trial
                low = 0 if interval[0].loss <= interval[1].loss else 1
                continue
            if self._flat_enough(trial):
                return trial
            if trial.slope * (interval[high].step - interval[low].step) >= 0:
                interval[high] = interval[low]  # the slope points back past the old low
            interval[low] = trial
        return interval[low]

    @staticmethod
    def _keep_inside(t, lo, hi, retreating):
        """Move a trial step that hugs an end of ``[lo, hi]``, the second time in a row
        (or at once if it lies on or past an end), to a tenth of the width inside."""
        margin = 0.1 * (hi - lo)
        if min(hi - t, t - lo) < margin:
            if retreating or t >= hi or t <= lo:
                return (hi - margin if abs(t - hi) < abs(t - lo) else lo + margin), False
            return t, True
        return t, False


class _CurvatureMemory:
    """The last ``size`` pairs s (step) and y (gradient change) with rho = 1 / (y.s), and
    the scaling gamma = s.y / y.y of the initial inverse Hessian (Nocedal & Wright 7.20).

    Its lists are PyTorch's state entries: ``old_stps`` (s), ``old_dirs`` (y), ``ro``,
    ``H_diag`` (gamma) and ``al`` (the first loop's coefficients, kept between steps).
    """

    def __init__(self, size, steps=(), changes=(), rhos=(), gamma=1, alphas=None):
        self.size = size
        self.steps, self.changes, self.rhos = list(steps), list(changes), list(rhos)
        self.gamma = gamma
        self.alphas = alphas

    def remember(self, s, y):
        sy = y.dot(s)
        if sy <= _MIN_CURVATURE:
            return  # not a descent-compatible pair: the estimate would lose definiteness
        if len(self.steps) == self.size:
            del self.steps[0], self.changes[0], self.rhos[0]
        self.steps.append(s)
        self.changes.append(y)
        self.rhos.append(1.0 / sy)
        self.gamma = sy / y.dot(y)

    def descent_direction(self, grad):
        """-H grad by the two-loop recursion (Algorithm 7.4)."""
        if self.alphas is None:
            self.alphas = [None] * self.size
        pairs = list(zip(self.steps, self.changes, self.rhos))
        v = -grad
        for i in reversed(range(len(pairs))):
            s, y, rho = pairs[i]
            self.alphas[i] = s.dot(v) * rho
            v += -self.alphas[i] * y
        v = v * self.gamma
        for i, (s, y, rho) in enumerate(pairs):
            v += (self.alphas[i] - y.dot(v) * rho) * s
        return v


def _to_state(value):
    """Arrays and NumPy scalars as tensors, lists element by element, the rest as is."""
    if isinstance(value, list):
        return [_to_state(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return wrap(np.asarray(value))
    return value


def _from_state(value):
    if isinstance(value, list):
        return [_from_state(v) for v in value]
    if isinstance(value, Tensor):
        data = array_of(value)
        return data if data.ndim else data[()]
    return value


class LBFGS(Optimizer):
    """L-BFGS over all parameters as one vector; ``step`` needs a closure.

    >>> import distgrad
    >>> x = distgrad.nn.Parameter(distgrad.tensor([3.0, -2.0], dtype=distgrad.float64))
    >>> opt = LBFGS([x], line_search_fn="strong_wolfe")
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((x - 1) ** 2).sum()
    ...     loss.backward()
    ...     return loss
    >>> _ = opt.step(closure); [round(v, 6) for v in x.tolist()]
    [1.0, 1.0]
    """

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7,
                 tolerance_change=1e-9, history_size=100, line_search_fn=None):
        _check_nonnegative(lr=lr)
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = dict(lr=lr, max_iter=max_iter, max_eval=max_eval,
                        tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                        history_size=history_size, line_search_fn=line_search_fn)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    def step(self, closure):
        """Run up to ``max_iter`` iterations; ``closure`` re-evaluates and returns the loss."""
        return super().step(closure)

    # -- the parameters as one flat vector --
    def _flat_grad(self):
        return np.concatenate([array_of(p.grad).reshape(-1) if p.grad is not None
                               else np.zeros(array_of(p).size, dtype=array_of(p).dtype)
                               for p in self._params])

    def _move(self, t, direction):
        """x += t * direction, parameter by parameter."""
        start = 0
        for p in self._params:
            data = array_of(p)
            data += t * direction[start:start + data.size].reshape(data.shape)
            bump_version(p)
            start += data.size

    def _restore(self, saved):
        for p, data in zip(self._params, saved):
            np.copyto(array_of(p), data)
            bump_version(p)

    def _loss(self, closure):
        with enable_grad():
            return closure()

    def _step(self, closure):
        with no_grad():
            return self._iterate(closure)

    def _line_search(self, closure, loss, grad, direction, slope, t, budget):
        """Strong-Wolfe search along ``direction``; leaves the parameters at the accepted
        step and returns ``(probe, evaluations)``."""
        saved = [array_of(p).copy() for p in self._params]

        def probe(step):
            self._move(step, direction)
            value = float(self._loss(closure))
            g = self._flat_grad()
            self._restore(saved)
            return _Probe(step, value, g, g.dot(direction))
        search = _WolfeSearch(probe, _Probe(0, loss, grad, slope),
                              np.abs(direction).max(), budget)
        best = search.run(t)
        self._move(best.step, direction)
        return best, search.evaluations

    def _iterate(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change = group["tolerance_grad"], group["tolerance_change"]
        line_search = group["line_search_fn"]

        # One state for the whole vector, kept with the first parameter (as PyTorch does).
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        first_loss = self._loss(closure)
        loss = float(first_loss)
        grad = self._flat_grad()
        evals = 1
        state["func_evals"] += 1
        if np.abs(grad).max() <= tol_grad:
            return first_loss  # already stationary

        saved = {k: _from_state(state.get(k)) for k in
                 ("d", "t", "old_dirs", "old_stps", "ro", "H_diag", "prev_flat_grad", "al")}
        d, t, prev_grad = saved["d"], saved["t"], saved["prev_flat_grad"]
        prev_loss = state.get("prev_loss")
        memory = _CurvatureMemory(group["history_size"], saved["old_stps"] or (),
                                  saved["old_dirs"] or (), saved["ro"] or (), saved["H_diag"],
                                  saved["al"])

        for it in range(1, max_iter + 1):
            state["n_iter"] += 1
            fresh = state["n_iter"] == 1
            if fresh:  # steepest descent, empty memory
                memory = _CurvatureMemory(group["history_size"], alphas=memory.alphas)
                d = -grad
            else:
                memory.remember(d * t, grad - prev_grad)
                d = memory.descent_direction(grad)
            prev_grad, prev_loss = grad.copy(), loss

            # The first step of a run is scaled so that it moves at most lr in the l1 sense.
            t = min(1.0, 1.0 / np.abs(grad).sum()) * lr if fresh else lr
            slope = grad.dot(d)
            if slope > -tol_change:
                break  # not a descent direction any more

            if line_search is not None:
                if line_search != "strong_wolfe":  # (checked here, when first needed, as in PyTorch)
                    raise RuntimeError("only 'strong_wolfe' is supported")
                best, used = self._line_search(closure, loss, grad, d, slope, t,
                                               budget=max_eval - evals)
                loss, grad, t = best.loss, best.grad, best.step
                converged = np.abs(grad).max() <= tol_grad
            else:
                self._move(t, d)
                used, converged = 0, False
                if it != max_iter:  # the last evaluation would be wasted (stochastic closures)
                    loss = float(self._loss(closure))
                    grad = self._flat_grad()
                    used, converged = 1, np.abs(grad).max() <= tol_grad
            evals += used
            state["func_evals"] += used

            if it == max_iter or evals >= max_eval or converged:
                break
            if np.abs(d * t).max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break  # no progress in the parameters or in the loss

        state.update(d=_to_state(d), t=_to_state(t), old_dirs=_to_state(memory.changes),
                     old_stps=_to_state(memory.steps), ro=_to_state(memory.rhos),
                     H_diag=_to_state(memory.gamma), prev_flat_grad=_to_state(prev_grad),
                     prev_loss=prev_loss)
        if memory.alphas is not None:
            state["al"] = _to_state(memory.alphas)
        return first_loss
