"""Schedules of one formula each.

Most are chained, as PyTorch defines them: each step multiplies the lr the group has
now by a factor (so they compose with other schedulers acting on the same groups).
Such a schedule says only what that factor is at ``last_epoch`` (``_factor``) and what
its closed form is in terms of ``base_lrs`` (``_closed_form``, used for
``step(epoch)``). LambdaLR and CosineAnnealingLR are written out.
"""
import math
import types
from bisect import bisect_right
from collections import Counter

from .base import LRScheduler


class _FactorSchedule(LRScheduler):
    """lr <- lr * ``_factor(i)`` for group ``i`` at each step."""

    def get_lr(self):
        self._warn_outside_step()
        return [group["lr"] * self._factor(i)
                for i, group in enumerate(self.optimizer.param_groups)]

    def _factor(self, i):
        raise NotImplementedError

    def _scaled_base(self, factor):
        return [base_lr * factor for base_lr in self.base_lrs]


class _PerGroupFunctions(LRScheduler):
    """LambdaLR and MultiplicativeLR take a function per group (or one for all). In the
    state dict a plain function is ``None`` and a callable object is its ``__dict__``."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"Expected {n} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        state = super().state_dict()
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else dict(vars(fn))
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("lr_lambdas")
        super().load_state_dict(state)
        for fn, attributes in zip(self.lr_lambdas, saved):
            if attributes is not None:
                vars(fn).update(attributes)


class LambdaLR(_PerGroupFunctions):
    """``lr = initial_lr * lr_lambda(epoch)``."""

    def get_lr(self):
        self._warn_outside_step()
        return [base_lr * fn(self.last_epoch) for fn, base_lr in zip(self.lr_lambdas,
                                                                       self.base_lrs)]


class MultiplicativeLR(_PerGroupFunctions, _FactorSchedule):
    """``lr *= lr_lambda(epoch)`` at each step."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        for fn in (lr_lambda if isinstance(lr_lambda, (list, tuple)) else [lr_lambda]):
            if not callable(fn):
                raise TypeError(f"lr_lambda should be a function, but got {type(fn).__name__}")
        super().__init__(optimizer, lr_lambda, last_epoch)

    def get_lr(self):
        if self._is_initial:
            self._warn_outside_step()
            return self._lrs()
        return _FactorSchedule.get_lr(self)

    def _factor(self, i):
        return self.lr_lambdas[i](self.last_epoch)


class StepLR(_FactorSchedule):
    """Multiply the lr by ``gamma`` every ``step_size`` epochs."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        on_boundary = self.last_epoch > 0 and self.last_epoch % self.step_size == 0
        return self.gamma if on_boundary else 1.0

    def _closed_form(self):
        return self._scaled_base(self.gamma ** (self.last_epoch // self.step_size))


class MultiStepLR(_FactorSchedule):
    """Multiply the lr by ``gamma`` at each milestone (a repeated milestone counts twice)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        hits = self.milestones.get(self.last_epoch, 0)
        return self.gamma ** hits if hits else 1.0

    def _closed_form(self):
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return self._scaled_base(self.gamma ** passed)


class ConstantLR(_FactorSchedule):
    """The lr times ``factor`` until epoch ``total_iters``, then the lr itself."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 <= factor <= 1.0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor = factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        if self.last_epoch == 0:
            return self.factor
        return 1.0 / self.factor if self.last_epoch == self.total_iters else 1.0

    def _closed_form(self):
        done = self.last_epoch >= self.total_iters
        return self._scaled_base(self.factor + done * (1 - self.factor))


class LinearLR(_FactorSchedule):
    """The lr's multiplier goes linearly from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1.0:
            raise ValueError("Starting multiplicative factor expected to be greater than 0 and "
                             "less or equal to 1.")
        if not 0 <= end_factor <= 1.0:
            raise ValueError("Ending multiplicative factor expected to be between 0 and 1.")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        epoch = self.last_epoch
        if epoch == 0:
            return self.start_factor
        if self._is_initial or epoch > self.total_iters:
            return 1.0
        # multiplier(e) / multiplier(e - 1), multiplier(e) = start + (end - start) e / total
        rise = self.end_factor - self.start_factor
        return 1.0 + rise / (self.total_iters * self.start_factor + (epoch - 1) * rise)

    def _closed_form(self):
        progress = min(self.total_iters, self.last_epoch) / self.total_iters
        return self._scaled_base(self.start_factor
                                 + (self.end_factor - self.start_factor) * progress)


class ExponentialLR(_FactorSchedule):
    """Multiply the lr by ``gamma`` every epoch."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        return 1.0 if self._is_initial else self.gamma

    def _closed_form(self):
        return self._scaled_base(self.gamma ** self.last_epoch)


class PolynomialLR(_FactorSchedule):
    """The lr falls to zero at ``total_iters`` as ``(1 - epoch / total_iters) ** power``."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = total_iters
        self.power = power
        super().__init__(optimizer, last_epoch)

    def _factor(self, i):
        epoch, total = self.last_epoch, self.total_iters
        if self._is_initial or epoch > total:
            return 1.0
        return ((1.0 - epoch / total) / (1.0 - (epoch - 1) / total)) ** self.power

    def _closed_form(self):
        remaining = 1.0 - min(self.total_iters, self.last_epoch) / self.total_iters
        return self._scaled_base(remaining ** self.power)


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial lr down to ``eta_min`` in ``T_max`` epochs and
    back up in the next ``T_max`` (SGDR's curve without restarts), chained as PyTorch
    documents it, so it follows lr changes made by others."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def _curve(self, epoch):
        return 1 + math.cos(math.pi * epoch / self.T_max)

    def get_lr(self):
        self._warn_outside_step()
        epoch, floor = self.last_epoch, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and epoch > 0:  # built with last_epoch: start on the curve
            return self._closed_form()
        groups = self.optimizer.param_groups
        if (epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            # leaving the bottom of the curve, where the ratio below would be 0 / 0
            return [g["lr"] + (base_lr - floor) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base_lr, g in zip(self.base_lrs, groups)]
        ratio = self._curve(epoch) / self._curve(epoch - 1)
        return [ratio * (g["lr"] - floor) + floor for g in groups]

    def _closed_form(self):
        return [self.eta_min + (base_lr - self.eta_min) * self._curve(self.last_epoch) / 2
                for base_lr in self.base_lrs]
