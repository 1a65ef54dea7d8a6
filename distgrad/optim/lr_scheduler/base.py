"""What every scheduler shares: per-group values, the step protocol with PyTorch's
warnings, and state dicts.

A scheduler's state dict is its ``__dict__`` without the optimizer, as PyTorch
documents, so its attribute names are PyTorch's (``base_lrs``, ``last_epoch``,
``_step_count``, ``_last_lr``, ...): a checkpoint written by either library loads
into the other.
"""
import warnings
from contextlib import contextmanager
from weakref import ref

from ..._tensor import Tensor
from ..optimizer import Optimizer


# PyTorch's text, which users filter warnings on.
EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where "
    "possible. Please use `scheduler.step()` to step the scheduler. During the deprecation, if "
    "epoch is different from None, the closed form is used instead of the new chainable form, "
    "where available. Please open an issue if you are unable to replicate your use case: "
    "https://github.com/pytorch/pytorch/issues/new/choose.")

_ORDER_HELP = "See more details at https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate"
_STEPPED_FIRST = (
    "Detected call of `lr_scheduler.step()` before `optimizer.step()`. In PyTorch 1.1.0 and "
    "later, you should call them in the opposite order: `optimizer.step()` before "
    "`lr_scheduler.step()`.  Failure to do this will result in PyTorch skipping the first value "
    "of the learning rate schedule. " + _ORDER_HELP)
_STEP_REPLACED = (
    "Seems like `optimizer.step()` has been overridden after learning rate scheduler "
    "initialization. Please, make sure to call `optimizer.step()` before `lr_scheduler.step()`. "
    + _ORDER_HELP)
_USE_GET_LAST_LR = ("To get the last learning rate computed by the scheduler, please use "
                    "`get_last_lr()`.")


def require_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")


def _copy(value):
    """Tensor hyperparameters are copied, so later in-place updates do not alias them."""
    return value.clone() if isinstance(value, Tensor) else value


def per_group(name, optimizer, value):
    """``value`` for each parameter group: a scalar repeated, a list checked for length."""
    n = len(optimizer.param_groups)
    if not isinstance(value, (list, tuple)):
        return [_copy(value)] * n
    if len(value) != n:
        raise ValueError(f"{name} must have the same length as optimizer.param_groups. "
                         f"{name} has {len(value)} values, param_groups has {n}.")
    return [_copy(v) for v in value]


def group_values(optimizer, key):
    return [_copy(group[key]) for group in optimizer.param_groups]


def assign(group, key, value):
    """Set a group's hyperparameter; a tensor one is filled in place, so holders see it."""
    if isinstance(group[key], Tensor):
        group[key].fill_(float(value))
    else:
        group[key] = value


@contextmanager
def _raised(obj, flag):
    """``obj.<flag>`` is True inside the block (both flags are state-dict entries)."""
    setattr(obj, flag, True)
    try:
        yield
    finally:
        setattr(obj, flag, False)


class _StepSpy:
    """Replaces ``optimizer.step`` by a function that records a call, so the first
    ``scheduler.step()`` can tell whether the optimizer stepped before it."""

    def __init__(self, optimizer):
        self.owner = ref(optimizer)  # the optimizer holds the spy: no cycle through it
        self.function = optimizer.step.__func__

    def __call__(self, *args, **kwargs):
        optimizer = self.owner()
        optimizer._stepped_since_scheduler = True
        return self.function(optimizer, *args, **kwargs)

    @classmethod
    def install(cls, optimizer):
        if not isinstance(optimizer.step, cls):
            optimizer.step = cls(optimizer)


class LRScheduler:
    """Base class: a subclass says what the lrs are (``get_lr``, chained from the current
    ones) and may give a closed form (``_closed_form``, from ``base_lrs``), used when
    ``step`` is given an epoch."""

    _get_lr_called_within_step = False
    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        require_optimizer(optimizer)
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", _copy(group["lr"]))
            elif "initial_lr" not in group:
                raise KeyError(
                    f"param 'initial_lr' is not specified in param_groups[{i}] when resuming "
                    "scheduler with last_epoch >= 0.\nThis typically happens when:\n1. "
                    "You're trying to resume training from a checkpoint but haven't properly "
                    "loaded the optimizer state\n2. You're using last_epoch >= 0 for a fresh "
                    "training run (not recommended)")
        self.base_lrs = group_values(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        _StepSpy.install(optimizer)
        self._start()

    def _start(self):
        """The step every scheduler takes when it is built (it sets the first lr)."""
        self._step_count = 0
        with _raised(self, "_is_initial"):
            self.step()

    def state_dict(self):
        """Every attribute but the optimizer."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)

    def get_last_lr(self):
        """The lrs the last ``step`` set, one per group."""
        return self._last_lr

    def get_lr(self):
        raise NotImplementedError

    def step(self, epoch=None):
        if self._step_count == 1:
            self._check_step_order()
        self._step_count += 1
        if epoch is not None:
            warnings.warn(EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._move_to(epoch)

    def _check_step_order(self):
        if not isinstance(self.optimizer.step, _StepSpy):
            warnings.warn(_STEP_REPLACED, UserWarning, stacklevel=3)
        elif not getattr(self.optimizer, "_stepped_since_scheduler", False):
            warnings.warn(_STEPPED_FIRST, UserWarning, stacklevel=3)

    def _move_to(self, epoch=None):
        """Next epoch by the chained rule, or jump to ``epoch`` by the closed form."""
        with _raised(self, "_get_lr_called_within_step"):
            if epoch is None:
                self.last_epoch += 1
                lrs = self.get_lr()
            else:
                self.last_epoch = epoch
                lrs = self._closed_form()
        self._apply(lrs)

    def _closed_form(self):
        return self.get_lr()  # where a schedule has none

    def _apply(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            assign(group, "lr", lr)
        self._last_lr = group_values(self.optimizer, "lr")

    def _warn_outside_step(self):
        if not self._get_lr_called_within_step:
            warnings.warn(_USE_GET_LAST_LR, UserWarning, stacklevel=3)

    def _lrs(self):
        return group_values(self.optimizer, "lr")
