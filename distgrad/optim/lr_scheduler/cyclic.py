"""Cyclic schedules: CyclicLR (Smith's cyclical learning rates), CosineAnnealingWarmRestarts
(SGDR) and OneCycleLR (the 1cycle policy). CyclicLR and OneCycleLR move the momentum
against the lr: ``momentum`` for SGD-like optimizers, ``betas[0]`` for Adam-like ones."""
import math
import types

from .base import LRScheduler, _raised, assign, per_group, require_optimizer


def _setup_momentum(scheduler, optimizer, base_momentum, max_momentum, last_epoch):
    """Per-group momentum bounds; a fresh run starts at ``max_momentum`` and records both
    bounds in the groups. Returns ``(bases, maxima)``."""
    if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
        raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option "
                         "enabled")
    scheduler.use_beta1 = "betas" in optimizer.defaults  # (a state-dict entry)
    maxima = per_group("max_momentum", optimizer, max_momentum)
    bases = per_group("base_momentum", optimizer, base_momentum)
    if last_epoch == -1:
        for group, low, high in zip(optimizer.param_groups, bases, maxima):
            _set_momentum(scheduler, group, high)
            group["max_momentum"], group["base_momentum"] = high, low
    return bases, maxima


def _set_momentum(scheduler, group, value):
    """``momentum`` for SGD-like optimizers, ``betas[0]`` for Adam-like ones."""
    if scheduler.use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


# CyclicLR's built-in amplitude policies: (scale of the cycle's amplitude, what it is a
# function of). From Smith (2017): constant, halved each cycle, gamma ** iteration.
_CYCLIC_MODES = {
    "triangular": (lambda gamma, x: 1.0, "cycle"),
    "triangular2": (lambda gamma, x: 1 / (2.0 ** (x - 1)), "cycle"),
    "exp_range": (lambda gamma, x: gamma ** x, "iterations"),
}


class CyclicLR(LRScheduler):
    """The lr goes from ``base_lr`` up to ``max_lr`` in ``step_size_up`` iterations and back
    in ``step_size_down``, the amplitude scaled by the mode (or ``scale_fn``)."""

    def __init__(self, optimizer, base_lr, max_lr, step_size_up=2000, step_size_down=None,
                 mode="triangular", gamma=1.0, scale_fn=None, scale_mode="cycle",
                 cycle_momentum=True, base_momentum=0.8, max_momentum=0.9, last_epoch=-1):
        require_optimizer(optimizer)
        self.optimizer = optimizer
        base_lrs = per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for group, lr in zip(optimizer.param_groups, base_lrs):
                assign(group, "lr", lr)
        self.max_lrs = per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = up if step_size_down is None else float(step_size_down)
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if scale_fn is None and mode not in _CYCLIC_MODES:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode = mode
        self.gamma = gamma
        self._scale_fn_custom = scale_fn
        self.scale_mode = scale_mode if scale_fn is not None else _CYCLIC_MODES[mode][1]
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            self.base_momentums, self.max_momentums = _setup_momentum(
                self, optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x):
        """The amplitude's scale at ``x`` (the cycle number or the iteration)."""
        if self._scale_fn_custom is not None:
            return self._scale_fn_custom(x)
        return _CYCLIC_MODES[self.mode][0](self.gamma, x)

    def _position(self):
        """(cycle number from 1, height in the cycle from 0 at base_lr to 1 at max_lr)."""
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle  # fraction of this cycle done
        if x <= self.step_ratio:
            return cycle, x / self.step_ratio
        return cycle, (x - 1) / (self.step_ratio - 1)

    def get_lr(self):
        self._warn_outside_step()
        cycle, height = self._position()
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [low + (high - low) * height * scale
               for low, high in zip(self.base_lrs, self.max_lrs)]
        if self.cycle_momentum:
            for group, low, high in zip(self.optimizer.param_groups, self.base_momentums,
                                        self.max_momentums):
                _set_momentum(self, group, high - (high - low) * height * scale)
        return lrs

    def state_dict(self):
        """A plain ``scale_fn`` is saved as ``None``, a callable object as its ``__dict__``."""
        state = super().state_dict()
        fn = self._scale_fn_custom
        state["_scale_fn_custom"] = (None if fn is None or isinstance(fn, types.FunctionType)
                                     else dict(vars(fn)))
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved_fn = state.pop("_scale_fn_custom")
        fn = self._scale_fn_custom
        super().load_state_dict(state)
        if saved_fn is not None:
            vars(fn).update(saved_fn)
        if fn is None:
            self.scale_mode = _CYCLIC_MODES[self.mode][1]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR: cosine annealing from the initial lr to ``eta_min`` over ``T_i`` epochs, then a
    restart; ``T_i`` starts at ``T_0`` and is multiplied by ``T_mult`` at each restart.
    ``step(epoch)`` accepts fractional epochs (e.g. ``epoch + batch / batches``)."""

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type "
                             f"{type(eta_min)}")
        self.T_0 = T_0
        self.T_i = T_0
        self.T_mult = T_mult
        self.eta_min = eta_min
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        return [self.eta_min + (base_lr - self.eta_min)
                * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base_lr in self.base_lrs]

    def _locate(self, epoch):
        """Set ``T_i`` and ``T_cur`` for an absolute epoch: the periods T_0 T_mult^k sum
        to T_0 (T_mult^n - 1) / (T_mult - 1) after n restarts."""
        if epoch < 0:
            raise ValueError(f"Expected non-negative epoch, but got {epoch}")
        if epoch < self.T_0:
            self.T_i, self.T_cur = self.T_0, epoch
        elif self.T_mult == 1:
            self.T_cur = epoch % self.T_0
        else:
            restarts = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
            self.T_cur = epoch - self.T_0 * (self.T_mult ** restarts - 1) / (self.T_mult - 1)
            self.T_i = self.T_0 * self.T_mult ** restarts

    def step(self, epoch=None):
        """Step by one, or jump to a (possibly fractional) ``epoch``."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur += 1
            if self.T_cur >= self.T_i:  # restart
                self.T_cur %= self.T_i
                self.T_i *= self.T_mult
        else:
            self._locate(epoch)
        self.last_epoch = math.floor(epoch)
        with _raised(self, "_get_lr_called_within_step"):
            lrs = self.get_lr()
        self._apply(lrs)


def _phase(end_step, start_lr, end_lr, start_momentum, end_momentum):
    """One phase of OneCycleLR: its last step and the group keys it anneals between (the
    layout of PyTorch's state dict)."""
    return {"end_step": end_step, "start_lr": start_lr, "end_lr": end_lr,
            "start_momentum": start_momentum, "end_momentum": end_momentum}


def _anneal_cos(start, end, pct):
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _anneal_linear(start, end, pct):
    return (end - start) * pct + start


class OneCycleLR(LRScheduler):
    """The 1cycle policy: from ``max_lr / div_factor`` up to ``max_lr``, then down far below
    the start (``/ final_div_factor``), with the momentum moving the other way; in
    ``total_steps`` steps (or ``epochs * steps_per_epoch``)."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        require_optimizer(optimizer)
        self.optimizer = optimizer
        self.total_steps = self._count_steps(total_steps, epochs, steps_per_epoch)
        peak = float(pct_start * self.total_steps) - 1
        last = self.total_steps - 1
        if three_phase:  # up, back down to the start, then the long descent
            phases = [_phase(peak, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                      _phase(float(2 * pct_start * self.total_steps) - 2, "max_lr",
                             "initial_lr", "base_momentum", "max_momentum"),
                      _phase(last, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
        else:
            phases = [_phase(peak, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                      _phase(last, "max_lr", "min_lr", "base_momentum", "max_momentum")]
        self._schedule_phases = phases
        if pct_start < 0 or pct_start > 1 or not isinstance(pct_start, float):
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be one of 'cos' or 'linear', instead got "
                             f"{anneal_strategy}")
        self._anneal_func_type = anneal_strategy
        peaks = per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for group, top in zip(optimizer.param_groups, peaks):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            _setup_momentum(self, optimizer, base_momentum, max_momentum, last_epoch)
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _count_steps(total_steps, epochs, steps_per_epoch):
        if total_steps is not None:
            if total_steps <= 0 or not isinstance(total_steps, int):
                raise ValueError(f"Expected positive integer total_steps, but got {total_steps}")
            return total_steps
        if epochs is None or steps_per_epoch is None:
            raise ValueError("You must define either total_steps OR (epochs AND steps_per_epoch)")
        if not isinstance(epochs, int) or epochs <= 0:
            raise ValueError(f"Expected positive integer epochs, but got {epochs}")
        if not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0:
            raise ValueError(f"Expected positive integer steps_per_epoch, but got "
                             f"{steps_per_epoch}")
        return epochs * steps_per_epoch

    def _current_phase(self, step):
        """(phase, fraction of it done at ``step``); the last phase takes any overshoot."""
        begin = 0.0
        for phase in self._schedule_phases[:-1]:
            if step <= phase["end_step"]:
                return phase, (step - begin) / (phase["end_step"] - begin)
            begin = phase["end_step"]
        phase = self._schedule_phases[-1]
        return phase, (step - begin) / (phase["end_step"] - begin)

    def get_lr(self):
        self._warn_outside_step()
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"Tried to step {step} times. The specified number of total "
                             f"steps is {self.total_steps}")
        anneal = _anneal_cos if self._anneal_func_type == "cos" else _anneal_linear
        phase, pct = self._current_phase(step)
        lrs = []
        for group in self.optimizer.param_groups:
            lrs.append(anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct))
            if self.cycle_momentum:
                _set_momentum(self, group, anneal(group[phase["start_momentum"]],
                                                  group[phase["end_momentum"]], pct))
        return lrs
