"""Schedulers made of schedulers: SequentialLR (one after another, switching at
milestones) and ChainedScheduler (all of them at every step, each on the lr the one
before it left). Their state dicts hold their children's under ``_schedulers``."""
from bisect import bisect_right

from .base import LRScheduler, assign, group_values
from .plateau import ReduceLROnPlateau


class _Composite(LRScheduler):
    def _adopt(self, optimizer, schedulers, chained):
        name = type(self).__name__
        if len(schedulers) < 1:
            raise ValueError(f"{name} expects at least one scheduler"
                             f"{' to be chained' if chained else ''}, but got no scheduler.")
        for i, child in enumerate(schedulers):
            if not hasattr(child, "optimizer"):
                raise TypeError(f"{name} at index {i} should have `optimizer` as its attribute.")
            if isinstance(child, ReduceLROnPlateau):
                raise ValueError(
                    f"{name} does not support `ReduceLROnPlateau` scheduler as it requires "
                    "additional kwargs to be specified when calling `step`, but got one at "
                    f"index {i} in the given schedulers sequence.")
            if optimizer != child.optimizer:
                raise ValueError(
                    f"{name} expects all schedulers to belong to the same optimizer, but got "
                    f"scheduler {type(child).__name__} at index {i} has {child.optimizer}, "
                    f"which is different from {type(optimizer).__name__}.")
        self._schedulers = schedulers
        self.optimizer = optimizer

    def state_dict(self):
        state = super().state_dict()
        state["_schedulers"] = [child.state_dict() for child in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        children = state.pop("_schedulers")
        super().load_state_dict(state)
        for child, saved in zip(self._schedulers, children):
            child.load_state_dict(saved)


class SequentialLR(_Composite):
    """``schedulers[i]`` drives the lr from ``milestones[i - 1]`` on; each one starts
    from the optimizer's initial lrs at its own epoch 0."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        self._adopt(optimizer, schedulers, chained=False)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more than "
                f"the number of milestone points, but got number of schedulers {len(schedulers)} "
                f"and the number of milestones to be equal to {len(milestones)}")
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        # Each child stepped once when it was built: take those steps back, then let the
        # one in charge at epoch 0 take its first step again.
        for group in optimizer.param_groups:
            assign(group, "lr", group["initial_lr"])
        self.recursive_undo()
        first = self._schedulers[bisect_right(milestones, 0)]
        first._start()
        self._last_lr = first.get_last_lr()

    def recursive_undo(self, sched=None):
        """Move every (nested) scheduler's ``last_epoch`` back by one."""
        target = self if sched is None else sched
        if hasattr(target, "_schedulers"):
            for child in target._schedulers:
                self.recursive_undo(child)
        elif hasattr(target, "last_epoch"):
            target.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        current = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            current._move_to(0)  # a hand-over: the next schedule starts at its epoch 0
        else:
            current.step()
        self._last_lr = current.get_last_lr()


class ChainedScheduler(_Composite):
    """Step every scheduler in the given order at each ``step()``."""

    def __init__(self, schedulers, optimizer=None):
        if optimizer is None and len(schedulers):
            optimizer = schedulers[0].optimizer
        self._adopt(optimizer, schedulers, chained=True)
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")

    def step(self):
        for child in self._schedulers:
            child.step()
        self._last_lr = group_values(self._schedulers[-1].optimizer, "lr")
