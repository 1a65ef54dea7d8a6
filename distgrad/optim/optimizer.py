"""``Optimizer``: parameter groups, per-parameter state, state dicts, step hooks.

Subclasses describe one parameter's update (``_init_state`` and ``_update`` on NumPy
arrays, written in place into the parameter's buffer); everything else is shared.
"""
import copy
from collections import OrderedDict, defaultdict
from itertools import chain

import numpy as np

from ..autograd.grad_mode import enable_grad, no_grad
from .._tensor import Tensor
from ..nn.parameter import zero_grads
from ..utils.hooks import RemovableHandle
from ..autograd._internal import array_of, wrap, bump_version, set_array

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()

_global_step_pre_hooks = OrderedDict()
_global_step_post_hooks = OrderedDict()


def register_optimizer_step_pre_hook(hook):
    handle = RemovableHandle(_global_step_pre_hooks)
    _global_step_pre_hooks[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook):
    handle = RemovableHandle(_global_step_post_hooks)
    _global_step_post_hooks[handle.id] = hook
    return handle


class Optimizer:
    """Base class: ``Optimizer(params, defaults)`` where params are tensors or group dicts."""

    def __init__(self, params, defaults):
        self.defaults = defaults
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_optimizer_step_pre_hooks", OrderedDict())
        self.__dict__.setdefault("_optimizer_step_post_hooks", OrderedDict())

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"\n    {key}: {group[key]}"
        return s + "\n)"

    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            param_group["params"] = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            param_group["params"] = list(params)
        for param in param_group["params"]:
            if not isinstance(param, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                + type(param).__name__)
            if not param.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        if len(param_group["params"]) != len({id(p) for p in param_group["params"]}):
            import warnings
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in "
                          "future, this will cause an error", stacklevel=3)
        existing = set()
        for group in self.param_groups:
            existing.update(id(p) for p in group["params"])
        if existing & {id(p) for p in param_group["params"]}:
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none=True):
        zero_grads((p for group in self.param_groups for p in group["params"]), set_to_none)

    # -- hooks --
    def register_step_pre_hook(self, hook):
        handle = RemovableHandle(self._optimizer_step_pre_hooks)
        self._optimizer_step_pre_hooks[handle.id] = hook
        return handle

    def register_step_post_hook(self, hook):
        handle = RemovableHandle(self._optimizer_step_post_hooks)
        self._optimizer_step_post_hooks[handle.id] = hook
        return handle

    # -- state dicts --
    def state_dict(self):
        index = {}
        start = 0

        def pack_group(group):
            nonlocal start
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in group["params"]]
            start += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        packed_state = {index[id(k)]: v for k, v in self.state.items()}
        return {"state": packed_state, "param_groups": param_groups}

    def load_state_dict(self, state_dict):
        state_dict = state_dict.copy()
        groups = self.param_groups
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        param_lens = (len(g["params"]) for g in groups)
        saved_lens = (len(g["params"]) for g in saved_groups)
        if any(p_len != s_len for p_len, s_len in zip(param_lens, saved_lens)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))

        def cast(param, value, key=None):
            if isinstance(value, Tensor):
                if key == "step":
                    return wrap(array_of(value).copy())
                data = array_of(value)
                if param.is_floating_point() and data.dtype.kind == "f":
                    data = data.astype(array_of(param).dtype)
                return wrap(data.copy())
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            return copy.deepcopy(value)

        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = cast(param, v)
            else:
                state[k] = v
        new_groups = []
        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            new_groups.append(new_group)
        self.__setstate__({"state": state, "param_groups": new_groups})

    # -- the update --
    def _init_state(self, p, state, group):
        """Create the per-parameter state on first use."""

    def _update(self, p, grad, state, group):
        """Update ``array_of(p)`` in place from the NumPy gradient ``grad``."""
        raise NotImplementedError

    def _check_group(self, group):
        """Reject a group whose options do not make sense together."""

    def _scratch(self, like):
        """A buffer shaped like ``like`` for an update's intermediates, shared by every
        parameter (not state: never saved). Intermediates written in place into one warm
        buffer, instead of a fresh array per operation, bring Adam from 1.3x to within
        1.1x of the same update written by hand (``scripts/bench_optim.py``)."""
        buffers = self.__dict__.setdefault("_scratch_buffers", {})
        flat = buffers.get(like.dtype)
        if flat is None or flat.size < like.size:
            flat = buffers[like.dtype] = np.empty(like.size, like.dtype)
        return flat[:like.size].reshape(like.shape)

    #: Whether ``_update`` given the dense form of a sparse gradient makes PyTorch's
    #: sparse update: true where entries without a gradient are left as they are (SGD,
    #: Adagrad); the others refuse sparse gradients, as PyTorch's do.
    _accepts_sparse_gradients = False

    def _sparse_gradient(self, grad, group):
        """The gradient ``_update`` gets for a sparse one: itself where
        ``_updates_sparse(group)`` (the update touches only its entries), else its dense form."""
        name = type(self).__name__
        if not self._accepts_sparse_gradients:
            hint = ", please consider SparseAdam instead" if name.startswith("Adam") else ""
            raise RuntimeError(f"{name} does not support sparse gradients{hint}")
        if group.get("weight_decay", 0):
            raise RuntimeError("weight_decay option is not compatible with sparse gradients")
        return grad if self._updates_sparse(group) else grad.to_dense()

    def _updates_sparse(self, group):
        return False

    def step(self, closure=None):
        """Update every parameter with a gradient; returns the closure's loss."""
        for hook in chain(_global_step_pre_hooks.values(),
                          self._optimizer_step_pre_hooks.values()):
            result = hook(self, (), {})
            if result is not None:
                raise RuntimeError("optimizer step pre-hooks must return None")
        loss = self._step(closure)
        for hook in chain(self._optimizer_step_post_hooks.values(),
                          _global_step_post_hooks.values()):
            hook(self, (), {})
        return loss

    def _step(self, closure):
        """The update between the step hooks: ``_update`` for each parameter with a gradient.

        Optimizers whose update is not per parameter (LBFGS) replace this.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                self._check_group(group)
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    grad = array_of(p.grad)
                    if type(grad) is not np.ndarray:  # a sparse gradient (distgrad.sparse)
                        grad = self._sparse_gradient(grad, group)
                    if group.get("maximize", False):
                        grad = -grad
                    state = self.state[p]
                    if not state:
                        self._init_state(p, state, group)
                    self._update(p, grad, state, group)
                    bump_version(p)
        return loss


_NONNEGATIVE_MESSAGES = {
    "lr": "Invalid learning rate: {}", "eps": "Invalid epsilon value: {}",
    "weight_decay": "Invalid weight_decay value: {}", "momentum": "Invalid momentum value: {}",
    "alpha": "Invalid alpha value: {}", "lr_decay": "Invalid lr_decay value: {}",
    "initial_accumulator_value": "Invalid initial_accumulator_value value: {}",
    "momentum_decay": "Invalid momentum_decay value: {}",
}


def _check_nonnegative(**values):
    """Raise PyTorch's ValueError for the first hyperparameter below zero."""
    for name, value in values.items():
        if not 0.0 <= value:
            raise ValueError(_NONNEGATIVE_MESSAGES[name].format(value))


def _check_betas(betas):
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


def _advance_step(state):
    """Count one more step in ``state["step"]`` (a float32 tensor, as PyTorch keeps it)."""
    step_t = state["step"]
    set_array(step_t, np.asarray(array_of(step_t) + np.float32(1)))  # 0-d + scalar is a NumPy scalar
    return float(array_of(step_t))


def _apply_weight_decay(param, grad, weight_decay, lr=None, decoupled=False):
    """L2 penalty folded into the gradient, or (``decoupled``) a shrink of the parameter."""
    if weight_decay == 0:
        return grad
    if decoupled:
        param *= 1 - lr * weight_decay
        return grad
    return grad + weight_decay * param


def _lerp_(start, end, weight, scratch=None):
    """``start.lerp_(end, weight)`` with PyTorch's two formulas (exact at both ends),
    computed in ``scratch`` (a buffer shaped like ``start``) when given."""
    diff = np.subtract(end, start, out=scratch)
    if abs(weight) < 0.5:
        diff *= weight
        start += diff
    else:
        diff *= 1 - weight
        np.subtract(end, diff, out=start)


def _init_step_and_buffers(p, state, *names):
    """The usual first state: a step counter and zero buffers shaped like ``p``."""
    state["step"] = _step_tensor()
    for name in names:
        state[name] = _zeros_state(p)


def _zeros_state(p):
    return wrap(np.zeros_like(array_of(p)))


def _step_tensor():
    return wrap(np.array(0.0, dtype=np.float32))
