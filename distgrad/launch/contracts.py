"""What a launch's processes say to each other, as records with one definition each.

The coordinator sets its workers up, sends them steps and reads their answers over RPC.
Each of those messages is a record below: a frozen dataclass that the codec carries as
an extension type (the fields' values, in order), checked against its definition when
it is made and again when it arrives. A field of the wrong type, or a record with fields
missing or extra (a worker running another version of distgrad), is refused with an
error that names the record and the field:

>>> StepWork(step=3, micro_batches="4", inputs=None, targets=None)
Traceback (most recent call last):
    ...
distgrad.launch.contracts.ContractError: StepWork.micro_batches: expected int, got str '4'

Only the shapes are checked here; what a value means (a layer range that fits the model,
a loss that exists) is the business of the code that uses it.
"""
import dataclasses
import types
import typing
from typing import Any, Optional

from distgrad import codec

__all__ = ["ContractError", "expect", "ModelSlice", "PipelineSetup", "RemoteSetup",
           "StageInfo", "RemoteStageInfo", "StepWork", "StepResult", "HostInfo"]


class ContractError(TypeError):
    """A record that does not match its definition (the message names the field)."""


def _name(kind):
    """``kind`` as a reader writes it: ``list``, ``tuple[str, int] or None``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is type(None):
        return "None"
    if kind is Ellipsis:
        return "..."
    if kind is Any:
        return "any value"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_name(k) for k in args)
    if origin is None:
        return getattr(kind, "__name__", str(kind))
    if all(a is Any or a is Ellipsis for a in args):
        return origin.__name__
    return f"{origin.__name__}[{', '.join(_name(a) for a in args)}]"


def _check(value, kind, where):
    """Raise :class:`ContractError` (naming ``where``) unless ``value`` is a ``kind``."""
    if kind is Any:
        return
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if not any(_predicate(k)(value) for k in args):
            raise ContractError(f"{where}: expected {_name(kind)}, got {_show(value)}")
        return
    if origin is None:
        fits = _fits(value, kind)
    else:  # list[X], tuple[X, ...], tuple[X, Y], dict[K, V]: the container, then its items
        fits = isinstance(value, (list, tuple) if origin in (list, tuple) else origin)
    if not fits:
        raise ContractError(f"{where}: expected {_name(origin or kind)}, got {_show(value)}")
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ContractError(f"{where}: expected {len(args)} items, got {len(value)}")
            items = zip(value, args)
        else:
            items = ((v, args[0]) for v in value) if args else ()
        for i, (v, k) in enumerate(items):
            _check(v, k, f"{where}[{i}]")
    elif origin is dict and args:
        for k, v in value.items():
            _check(k, args[0], f"{where} key {k!r}")
            _check(v, args[1], f"{where}[{k!r}]")


def expect(value, kind, where):
    """``value``, if it is a ``kind`` (a record class, or ``list[StepWork]``...); else
    :class:`ContractError` naming ``where`` (what a function received, by name)."""
    _check(value, kind, where)
    return value


def _predicate(kind):
    """A fast ``fits(value) -> bool`` of ``kind``, made once per field: a record is checked
    on every step, and :func:`_check` (which names what does not fit) runs only when this
    says no."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return lambda v: True
    if origin in (typing.Union, types.UnionType):
        alternatives = [_predicate(k) for k in args]
        return lambda v: any(p(v) for p in alternatives)
    if origin is None:
        return lambda v: _fits(v, kind)
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            items = [_predicate(k) for k in args]
            return lambda v: isinstance(v, (list, tuple)) and len(v) == len(items) and \
                all(p(x) for p, x in zip(items, v))
        if not args or args[0] is Any:
            return lambda v: isinstance(v, (list, tuple))
        item = _predicate(args[0])
        return lambda v: isinstance(v, (list, tuple)) and all(item(x) for x in v)
    if origin is dict and args:
        key, value = _predicate(args[0]), _predicate(args[1])
        return lambda v: isinstance(v, dict) and all(key(k) and value(x) for k, x in v.items())
    return lambda v: isinstance(v, origin)


def _fits(value, kind):
    """Whether ``value`` is a ``kind``, a plain type (not a generic or a union)."""
    if kind is type(None):
        return value is None
    if kind is float:  # an int is a float, as in Python's typing; a bool is neither
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return kind is Any or isinstance(value, kind)


def _show(value):
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def contract(code):
    """Make the class a record: a frozen dataclass checked when made, carried by the
    codec as extension type ``code`` and checked again when it arrives."""
    def make(cls):
        def check(self):  # the dataclass's __init__ calls it (set before it is made)
            for name, kind, fits in fields:
                value = getattr(self, name)
                if not fits(value):
                    _check(value, kind, f"{cls.__name__}.{name}")

        cls.__post_init__ = check
        cls = dataclasses.dataclass(frozen=True)(cls)
        hints = typing.get_type_hints(cls)
        fields = [(f.name, hints[f.name], _predicate(hints[f.name]))
                  for f in dataclasses.fields(cls)]

        def decode(payload, dec):
            if not isinstance(payload, list) or len(payload) != len(fields):
                got = len(payload) if isinstance(payload, list) else _show(payload)
                raise ContractError(
                    f"{cls.__name__}: expected its {len(fields)} fields "
                    f"({', '.join(n for n, _, _ in fields)}), got {got} (does the sender run "
                    f"the same version of distgrad?)")
            return cls(*payload)

        codec.register(cls, code, lambda record, enc: [getattr(record, n) for n, _, _ in fields],
                       decode)
        return cls
    return make


@contract(40)
class ModelSlice:
    """The layers a worker holds, and how to build them: every worker builds the whole
    model from the same seed (so the parameters equal those of the model built in one
    process) and keeps its layer ranges."""
    factory: Any                       # the model factory (a function, by reference)
    factory_kwargs: dict[str, Any]
    seed: int
    #: ``(stage index, first layer, end layer)`` of each stage it holds
    parts: list[tuple[int, int, int]]
    checkpoint_activations: str        # model.checkpoint_activations
    deferred_weights: list[str]        # parameters whose gradients wait (defer_weight_grads)


@contract(41)
class PipelineSetup:
    """A worker's stages in the pipeline strategy (``distgrad.launch.stage.setup``)."""
    model: ModelSlice
    worker: int                        # its index among all workers (names its messages)
    stage: int                         # its rank in its pipeline
    stages: int                        # ranks in a pipeline
    num_stages: int                    # the model's stages (virtual ones included)
    pipeline: list[str]                # the workers of its pipeline, by pipeline rank
    replica: int
    replicas: int
    store: Optional[tuple[str, int]]   # the replicas' TCPStore, with replicas
    schedule: str                      # pipeline.schedule
    optimizer: Any                     # the optimizer class (by reference)
    optimizer_kwargs: dict[str, Any]
    loss: str                          # model.loss
    hooks: list[tuple[Any, dict[str, Any]]]  # (function, keyword arguments) of [[hooks]]
    offload: dict[str, Any]            # the [offload] table (empty: none)
    heartbeat_timeout: float
    rendezvous_timeout: float
    simulated_link: Any                # world.simulated_link, for the replicas' group
    timeout: float                     # of RPCs and of waits (0: none)
    trace: bool
    resume_from: Optional[str]         # the checkpoint directory to start from


@contract(42)
class RemoteSetup:
    """A worker's stage in the autograd strategy (``distgrad.launch.remote_stage``)."""
    model: ModelSlice
    stage: int
    stages: int
    timeout: float                     # of RPCs and of waits (0: none)
    trace: bool
    resume_from: Optional[str]


@contract(45)
class StageInfo:
    """A pipeline worker's answer to its setup."""
    parameters: int                    # of the stages it holds
    pid: int


@contract(46)
class RemoteStageInfo:
    """A remote stage's description (``RemoteStage.describe``): its size, and RRefs to its
    module and parameters, for the coordinator's optimizer and hooks."""
    parameters: int
    module: Any                        # RRef of its module
    named_parameters: dict[str, Any]   # parameter name -> RRef of the parameter


@contract(47)
class HostInfo:
    """Where a worker runs (``distgrad.launch.placement.where``)."""
    hostname: str
    address: str                       # the address it is reached at from the coordinator


@contract(43)
class StepWork:
    """One step (or evaluation batch) for a pipeline stage: the inputs go to the first
    stage, the targets to the last (None elsewhere), one array per micro-batch."""
    step: int                          # names the step's messages (negative: evaluation)
    micro_batches: int
    inputs: Optional[list[Any]]
    targets: Optional[list[Any]]


@contract(44)
class StepResult:
    """A stage's answer for one step: the last stage's loss and accuracy counts (zero
    elsewhere), what its hooks reported, and how long before the answer left it finished."""
    loss: float
    correct: int
    count: int
    reported: dict[str, float]         # "<hook value>.stage<k>" -> value
    seconds_ago: float

    @classmethod
    def of(cls, counts, reported=None, seconds_ago=0.0):
        """The result of ``counts`` (``{"loss", "correct", "count"}`` as
        :func:`~distgrad.launch.losses.add_micro_batch_loss` adds them up)."""
        return cls(float(counts["loss"]), int(counts["correct"]), int(counts["count"]),
                   dict(reported or {}), float(seconds_ago))
