"""Schedulers of schedulers: SequentialLR (one after another at milestones) and
ChainedScheduler (all of them at every step)."""
from bisect import bisect_right

from .base import LRScheduler, _param_groups_val_list, _update_param_group_val
from .plateau import ReduceLROnPlateau


class _SchedulerOfSchedulers(LRScheduler):
    """Shared by SequentialLR and ChainedScheduler: child schedulers saved by their state dicts."""

    def _check_children(self, optimizer, schedulers, what):
        if len(schedulers) < 1:
            raise ValueError(f"{type(self).__name__} expects at least one scheduler{what}, but "
                             "got no scheduler.")
        for idx, scheduler in enumerate(schedulers):
            if not hasattr(scheduler, "optimizer"):
                raise TypeError(f"{type(self).__name__} at index {idx} should have `optimizer` "
                                "as its attribute.")
            if isinstance(scheduler, ReduceLROnPlateau):
                raise ValueError(
                    f"{type(self).__name__} does not support `ReduceLROnPlateau` scheduler as it "
                    "requires additional kwargs to be specified when calling `step`, but got one "
                    f"at index {idx} in the given schedulers sequence.")
            if optimizer != scheduler.optimizer:
                raise ValueError(
                    f"{type(self).__name__} expects all schedulers to belong to the same "
                    f"optimizer, but got scheduler {type(scheduler).__name__} at index {idx} has "
                    f"{scheduler.optimizer}, which is different from "
                    f"{type(optimizer).__name__}.")

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        schedulers = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        state_dict["_schedulers"] = schedulers
        for scheduler, saved in zip(self._schedulers, schedulers):
            scheduler.load_state_dict(saved)


class SequentialLR(_SchedulerOfSchedulers):
    """Hand over from one scheduler to the next at each milestone."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        self._check_children(optimizer, schedulers, "")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                "Sequential Schedulers expects number of schedulers provided to be one more than "
                f"the number of milestone points, but got number of schedulers {len(schedulers)} "
                f"and the number of milestones to be equal to {len(milestones)}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # The children each took a first step when they were built; undo those.
        for group in self.optimizer.param_groups:
            _update_param_group_val(group, "lr", group["initial_lr"])
        self.recursive_undo()
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = schedulers[idx].get_last_lr()

    def recursive_undo(self, sched=None):
        scheds = self if sched is None else sched
        if hasattr(scheds, "_schedulers"):
            for s in scheds._schedulers:
                self.recursive_undo(s)
        elif hasattr(scheds, "last_epoch"):
            scheds.last_epoch -= 1

    def step(self):
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            scheduler._update_lr(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()


class ChainedScheduler(_SchedulerOfSchedulers):
    """Step every scheduler in turn, each acting on the lr the previous one left."""

    def __init__(self, schedulers, optimizer=None):
        optimizer = optimizer or (schedulers[0].optimizer if len(schedulers) else None)
        self._check_children(optimizer, schedulers, " to be chained")
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")

    def step(self):
        for scheduler in self._schedulers:
            scheduler.step()
        self._last_lr = _param_groups_val_list(self._schedulers[-1].optimizer, "lr")
