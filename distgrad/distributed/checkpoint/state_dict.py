"""State dicts of (DDP-wrapped) models and their optimizers with canonical keys
(``torch.distributed.checkpoint.state_dict``).

A canonical key is a parameter's name in the model without its wrappers: a
``DistributedDataParallel``'s ``module.`` prefix is dropped, so a checkpoint of a
DDP model loads into the bare model and back. Optimizer state is keyed by those
names instead of parameter positions, so it follows the parameters, whichever
optimizer layout loads it. Which options PyTorch has that only matter for sharded
models (``full_state_dict``, ``cpu_offload``) do here what they do for a replicated
DDP model in PyTorch: every tensor is already whole and on the CPU.

    >>> import distgrad
    >>> from distgrad.distributed.checkpoint.state_dict import get_state_dict
    >>> model = distgrad.nn.Linear(2, 2)
    >>> optim = distgrad.optim.Adam(model.parameters())
    >>> model_sd, optim_sd = get_state_dict(model, optim)
    >>> sorted(optim_sd["state"])
    ['bias', 'weight']
"""
import warnings
from dataclasses import dataclass

from distgrad.autograd.grad_mode import no_grad
from distgrad.nn.modules.module_state_dict import _IncompatibleKeys
from distgrad.nn.parallel import DistributedDataParallel
from distgrad.optim import Optimizer
from distgrad.ops.creation import zeros_like

from ..object_collectives import broadcast_object_list
from ..process_group import get_rank, is_initialized

__all__ = ["StateDictOptions", "get_model_state_dict", "get_optimizer_state_dict",
           "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict",
           "set_state_dict"]

_STATE, _PG, _PARAMS = "state", "param_groups", "params"


@dataclass
class StateDictOptions:
    """How the helpers work:

    - ``full_state_dict``: tensors gathered whole (here they always are);
    - ``cpu_offload``: tensors on the CPU (here they always are); with
      ``full_state_dict`` too, only rank 0 gets the state dict, the others ``{}``;
    - ``ignore_frozen_params``: leave out parameters with ``requires_grad=False``;
    - ``keep_submodule_prefixes``: with ``submodules``, keep their prefixes in the keys;
    - ``strict``: ``strict`` of ``load_state_dict``; missing optimizer state is an error;
    - ``broadcast_from_rank0``: the ``set_*`` functions take rank 0's state dict and send
      it to every rank (needs ``full_state_dict``);
    - ``flatten_optimizer_state_dict``: optimizer state as flat ``state.<fqn>.<name>`` and
      ``param_groups.<fqn>.<option>`` keys;
    - ``dsd_fqn_modifiers``: the name of a module method mapping a child's name to a
      wrapped attribute that keys skip.
    """
    full_state_dict: bool = False
    cpu_offload: bool = False
    ignore_frozen_params: bool = False
    keep_submodule_prefixes: bool = True
    strict: bool = True
    broadcast_from_rank0: bool = False
    flatten_optimizer_state_dict: bool = False
    dsd_fqn_modifiers: str = "_fqn_modifiers"


def _options(options, submodules=None):
    options = options or StateDictOptions()
    if submodules:
        warnings.warn("Getting submodules only model/optim state_dict is deprecated and will be "
                      "removed in 2.5. This feature can be achieved by manually filtering out "
                      "the state_dict returned from get_state_dict.", FutureWarning, stacklevel=3)
    if options.broadcast_from_rank0 and not options.full_state_dict:
        raise ValueError("full_state_dict must be True when broadcast_from_rank0 is True.")
    return options


def _canonical(model, name, modifiers="_fqn_modifiers"):
    """``name`` (a key of ``model.state_dict()``) without wrapper prefixes."""
    obj, out = model, []
    for part in name.split("."):
        if isinstance(obj, DistributedDataParallel) and part == "module":
            obj = obj.module
            continue
        if hasattr(obj, modifiers):
            wrapped = getattr(obj, modifiers)().get(part)
            if wrapped and hasattr(obj, wrapped):
                obj = getattr(obj, wrapped)
        out.append(part)
        obj = getattr(obj, part, None)
    return ".".join(out)


def _param_fqns(model, modifiers):
    """``{id(param): fqn}`` of every parameter (the first name of a shared one)."""
    out = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), _canonical(model, name, modifiers))
    return out


def _rank0_only(options):
    return options.full_state_dict and options.cpu_offload and is_initialized() \
        and get_rank() != 0


def _submodule_prefixes(model, submodules, modifiers):
    wanted = {id(m) for m in submodules}
    return [_canonical(model, name, modifiers) + "." for name, m in model.named_modules()
            if id(m) in wanted]


# ------------------------------------------------------------------ model
def _model_state_dict(model, options, submodules=None):
    with no_grad():
        sd = {_canonical(model, k, options.dsd_fqn_modifiers): v
              for k, v in model.state_dict().items()}
    if submodules:
        kept = {}
        for prefix in _submodule_prefixes(model, submodules, options.dsd_fqn_modifiers):
            for k, v in sd.items():
                if k.startswith(prefix):
                    kept[k if options.keep_submodule_prefixes else k[len(prefix):]] = v
        sd = kept
    if options.ignore_frozen_params:
        for name, p in model.named_parameters():
            if not p.requires_grad:
                sd.pop(_canonical(model, name, options.dsd_fqn_modifiers), None)
    return {} if _rank0_only(options) else sd


def _check_model(sd, options, submodules=None):
    if not sd and not submodules and not options.ignore_frozen_params and options.strict \
            and not (options.cpu_offload and options.full_state_dict) \
            and not options.broadcast_from_rank0:
        raise RuntimeError("The option indicates that model state_dict is required to save or "
                           "load, but model state_dict is empty.")


def get_model_state_dict(model, *, submodules=None, options=None):
    """``model``'s state dict with canonical keys (see the module docstring)."""
    options = _options(options, submodules)
    sd = _model_state_dict(model, options, submodules)
    _check_model(sd, options, submodules)
    return sd


def _broadcast(value):
    box = [value if get_rank() == 0 else None]
    broadcast_object_list(box, src=0)
    return box[0]


def _load_model(model, state_dict, options):
    if options.broadcast_from_rank0 and is_initialized():
        state_dict = _broadcast(state_dict)
    if not state_dict:
        return _IncompatibleKeys([], [])
    state_dict = dict(state_dict)
    for key in model.state_dict():
        fqn = _canonical(model, key, options.dsd_fqn_modifiers)
        if fqn == key:
            continue
        if fqn in state_dict:
            state_dict[key] = state_dict.pop(fqn)
        elif options.strict:
            raise RuntimeError(f"Missing key: {fqn}.")
    return model.load_state_dict(state_dict, strict=options.strict)


def set_model_state_dict(model, model_state_dict, *, options=None):
    """Load a canonical-key state dict into ``model`` (DDP or not); returns the missing and
    unexpected keys as ``load_state_dict`` does."""
    options = _options(options)
    _check_model(model_state_dict, options)
    return _load_model(model, model_state_dict, options)


# ------------------------------------------------------------------ optimizers
def _optimizers(optimizers):
    return (optimizers,) if isinstance(optimizers, Optimizer) else tuple(optimizers)


def _init_optim_state(optim):
    """Make an optimizer that has not stepped yet hold its state (zeros), so a checkpoint
    has tensors to load into: one step on zero gradients with a learning rate of 0."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g[_PARAMS]]
    if any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = zeros_like(p)
    lrs = [g["lr"] for g in optim.param_groups if "lr" in g]
    for g in optim.param_groups:
        if "lr" in g:
            g["lr"] = 0.0
    try:
        optim.step()
    finally:
        for g in optim.param_groups:
            if "lr" in g:
                g["lr"] = lrs.pop(0)
        optim.zero_grad(set_to_none=True)


def _flatten_optim(osd):
    out = {}

    def walk(value, prefix):
        for k, v in value.items():
            key = f"{prefix}.{k}"
            if isinstance(v, dict):
                walk(v, key)
            else:
                out[key] = v
    for fqn, state in osd[_STATE].items():
        walk(state, f"{_STATE}.{fqn}")
    for group in osd[_PG]:
        for fqn in group[_PARAMS]:
            for k, v in group.items():
                if k != _PARAMS:
                    out[f"{_PG}.{fqn}.{k}"] = v
    return out


def _optim_state_dict(model, optimizers, options):
    fqns = _param_fqns(model, options.dsd_fqn_modifiers)
    osd = {_STATE: {}, _PG: []}
    for optim in optimizers:
        _init_optim_state(optim)
        raw = optim.state_dict()
        params = [p for g in optim.param_groups for p in g[_PARAMS]]
        missing = [i for i, p in enumerate(params) if id(p) not in fqns]
        if missing:
            raise RuntimeError(f"the optimizer holds parameters {missing} (by position) that "
                               f"are not parameters of the model")
        name = {i: fqns[id(p)] for i, p in enumerate(params)}
        osd[_STATE].update({name[k]: v for k, v in raw[_STATE].items()})
        for g in raw[_PG]:
            osd[_PG].append({**g, _PARAMS: [name[i] for i in g[_PARAMS]]})
    if options.flatten_optimizer_state_dict:
        osd = _flatten_optim(osd)
    return {} if _rank0_only(options) else osd


def _check_optim(osd, options):
    if not osd and not (options.cpu_offload and options.full_state_dict) \
            and not options.broadcast_from_rank0:
        raise RuntimeError("The option indicates that model state_dict is required to save, or "
                           f"load but optim state_dict is empty. {osd}")


def get_optimizer_state_dict(model, optimizers, *, submodules=None, options=None):
    """The optimizers' state dict, keyed by the parameters' canonical names."""
    options = _options(options, submodules)
    osd = _optim_state_dict(model, _optimizers(optimizers), options)
    _check_optim(osd, options)
    return osd


def _unflatten_value(prefix, flat):
    nested = {}
    for key, value in flat.items():
        if key.startswith(prefix + "."):
            parts = key[len(prefix) + 1:].split(".")
            here = nested
            for part in parts[:-1]:
                here = here.setdefault(part, {})
            here[parts[-1]] = value
    return nested


def _optim_for(optim, osd, fqns, options):
    """``osd`` (canonical keys, maybe flat) as ``optim.load_state_dict`` takes it: its
    groups in its order, state keyed by the names it lists."""
    flat = _STATE not in osd
    state, groups = {}, []
    for group in optim.param_groups:
        names = [fqns[id(p)] for p in group[_PARAMS]]
        options_of = {}
        for name, p in zip(names, group[_PARAMS]):
            if flat:
                saved = {k: osd[f"{_PG}.{name}.{k}"] for k in group if k != _PARAMS
                         and f"{_PG}.{name}.{k}" in osd}
                own = _unflatten_value(f"{_STATE}.{name}", osd)
                present = bool(own)
            else:
                saved = next(({k: v for k, v in g.items() if k != _PARAMS} for g in osd[_PG]
                              if name in g[_PARAMS]), {})
                own, present = osd[_STATE].get(name), name in osd[_STATE]
            for k, v in saved.items():
                if k in options_of and options_of[k] != v:
                    raise RuntimeError("All the parameters in the same parameter group should "
                                       f"have the same saved param_group value. But {name}.{k} "
                                       f"is {v} while other(s) is {options_of[k]}.")
                options_of[k] = v
            if p.requires_grad:
                if present:
                    state[name] = own
                elif options.strict:
                    raise RuntimeError(f"Missing optimizer state for parameter '{name}' in "
                                       "checkpoint. The parameter requires gradients but has no "
                                       "saved optimizer state. To load anyway, use "
                                       "StateDictOptions(strict=False).")
        groups.append({**{k: v for k, v in group.items() if k != _PARAMS}, **options_of,
                       _PARAMS: names})
    return {_STATE: state, _PG: groups}


def _load_optim(model, optimizers, osd, options):
    if options.broadcast_from_rank0 and is_initialized():
        osd = _broadcast(osd)
    fqns = _param_fqns(model, options.dsd_fqn_modifiers)
    for optim in optimizers:
        _init_optim_state(optim)
        if osd:
            optim.load_state_dict(_optim_for(optim, osd, fqns, options))


def set_optimizer_state_dict(model, optimizers, optim_state_dict, *, options=None):
    """Load a state dict from :func:`get_optimizer_state_dict` into ``optimizers``."""
    options = _options(options)
    _check_optim(optim_state_dict, options)
    _load_optim(model, _optimizers(optimizers), optim_state_dict, options)


# ------------------------------------------------------------------ both
def get_state_dict(model, optimizers, *, submodules=None, options=None):
    """``(model state dict, optimizer state dict)``, both with canonical keys."""
    options = _options(options, submodules)
    sd = _model_state_dict(model, options, submodules)
    osd = _optim_state_dict(model, _optimizers(optimizers), options)
    _check_model(sd, options, submodules)
    _check_optim(osd, options)
    return sd, osd


def set_state_dict(model, optimizers, *, model_state_dict, optim_state_dict, options=None):
    """Load both; returns the model's missing and unexpected keys."""
    options = _options(options)
    optimizers = _optimizers(optimizers)
    if model_state_dict:
        _check_model(model_state_dict, options)
    _check_optim(optim_state_dict, options)
    _load_optim(model, optimizers, optim_state_dict, options)
    return _load_model(model, model_state_dict, options)
