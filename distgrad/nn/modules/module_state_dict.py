"""Saving and loading a module's state dict (``Module.state_dict``, ``load_state_dict`` and
their per-module halves), as PyTorch's: defined here, bound in ``Module``'s class body."""
import itertools
from collections import OrderedDict, namedtuple

from ...autograd.grad_mode import no_grad
from ..._tensor import Tensor
from ..parameter import Parameter


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _save_to_state_dict(self, destination, prefix, keep_vars):
    for name, param in self._parameters.items():
        if param is not None:
            destination[prefix + name] = param if keep_vars else param.detach()
    for name, buf in self._buffers.items():
        if buf is not None and name not in self._non_persistent_buffers_set:
            destination[prefix + name] = buf if keep_vars else buf.detach()


def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
    if args:
        destination = args[0] if len(args) > 0 else destination
        prefix = args[1] if len(args) > 1 else prefix
        keep_vars = args[2] if len(args) > 2 else keep_vars
    if destination is None:
        destination = OrderedDict()
    self._save_to_state_dict(destination, prefix, keep_vars)
    for name, module in self._modules.items():
        if module is not None:
            module.state_dict(destination=destination, prefix=prefix + name + ".",
                              keep_vars=keep_vars)
    for hook in self._state_dict_hooks.values():
        result = hook(self, destination, prefix, {})
        if result is not None:
            destination = result
    return destination


def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                          unexpected_keys, error_msgs, assign=False):
    persistent = {k: v for k, v in self._buffers.items()
                  if k not in self._non_persistent_buffers_set}
    local_state = {k: v for k, v in itertools.chain(self._parameters.items(),
                                                    persistent.items()) if v is not None}
    for name, param in local_state.items():
        key = prefix + name
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            continue
        input_param = state_dict[key]
        if not isinstance(input_param, Tensor):
            error_msgs.append(f'While copying the parameter named "{key}", expected '
                              "torch.Tensor or Tensor-like object from checkpoint but "
                              f"received {type(input_param)}")
            continue
        if tuple(input_param.shape) != tuple(param.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                              f"{input_param.shape} from checkpoint, the shape in current "
                              f"model is {param.shape}.")
            continue
        try:
            with no_grad():
                if assign:
                    if isinstance(param, Parameter):
                        new = Parameter(input_param.detach(), param.requires_grad)
                        self._parameters[name] = new
                    else:
                        self._buffers[name] = input_param
                else:
                    param.copy_(input_param)
        except Exception as ex:  # collected, as PyTorch does, and raised together
            error_msgs.append(f'While copying the parameter named "{key}", whose dimensions '
                              f"in the model are {param.shape} and whose dimensions in the "
                              f"checkpoint are {input_param.shape}, an exception occurred : "
                              f"{ex.args}.")
    if strict:
        for key in state_dict.keys():
            if key.startswith(prefix):
                input_name = key[len(prefix):].split(".", 1)
                if input_name[0] not in self._modules and input_name[0] not in local_state:
                    unexpected_keys.append(key)


def load_state_dict(self, state_dict, strict=True, assign=False):
    if not isinstance(state_dict, dict):
        raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
    missing_keys, unexpected_keys, error_msgs = [], [], []
    state_dict = OrderedDict(state_dict)

    def load(module, local_state_dict, prefix=""):
        for hook in module._load_state_dict_pre_hooks.values():
            hook(local_state_dict, prefix, {}, strict, missing_keys, unexpected_keys,
                 error_msgs)
        module._load_from_state_dict(local_state_dict, prefix, {}, True, missing_keys,
                                     unexpected_keys, error_msgs, assign)
        for name, child in module._modules.items():
            if child is not None:
                child_prefix = prefix + name + "."
                child_state = {k: v for k, v in local_state_dict.items()
                               if k.startswith(child_prefix)}
                load(child, child_state, child_prefix)
        incompatible = _IncompatibleKeys(missing_keys, unexpected_keys)
        for hook in module._load_state_dict_post_hooks.values():
            hook(module, incompatible)

    load(self, state_dict)
    if strict:
        if unexpected_keys:
            error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected_keys)))
        if missing_keys:
            error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing_keys)))
    if error_msgs:
        raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
            type(self).__name__, "\n\t".join(error_msgs)))
    return _IncompatibleKeys(missing_keys, unexpected_keys)
