"""The schedules (``torch.distributed.pipelining.schedules``).

One stage per rank: :class:`ScheduleGPipe`, :class:`Schedule1F1B`. Several per rank (a
list of this rank's stages): :class:`ScheduleLoopedBFS`, :class:`ScheduleInterleaved1F1B`,
:class:`ScheduleInterleavedZeroBubble`, :class:`ScheduleZBVZeroBubble`,
:class:`ScheduleDualPipeV`; and :class:`_PipelineScheduleRuntime`, which runs any order
given as actions (a CSV file, ``_load_csv``, or distgrad's ``_load_actions`` for a dict or
CSV text). Their orders come from :mod:`.orders`; all run on one executor
(:mod:`.runtime`).

>>> get_schedule_class("gpipe").__name__
'ScheduleGPipe'
"""
import logging

from ._utils import generate_stage_to_rank_mapping
# the IR, its passes and the base classes: importable from here, as from PyTorch's module
from .actions import (B, BACKWARD_INPUT, BACKWARD_WEIGHT, F, FORWARD, FULL_BACKWARD,  # noqa: F401
                      I, OVERLAP_F_B, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B, SEND_F,
                      UNSHARD, W, _Action, _ComputationType, _format_pipeline_order,
                      parse_actions, read_actions_csv, write_actions_csv)
from .lowering import (_add_reduce_grad, _add_send_recv, _add_unshard_reshard,  # noqa: F401
                       _defer_recv_ops, _merge_bw, _simulate_comms_compute,
                       _validate_schedule)
from . import orders
from .runtime import (PipelineScheduleMulti, PipelineScheduleSingle,  # noqa: F401
                      _PipelineContext, _PipelineSchedule)

__all__ = ["get_schedule_class", "PipelineScheduleSingle", "PipelineScheduleMulti",
           "Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]

log = logging.getLogger(__name__)


class _ScheduleForwardOnly(PipelineScheduleSingle):
    """Forward passes only."""

    def _get_pipeline_order(self):
        return {r: orders.forward_only(r, self._num_stages, self._n_microbatches)
                for r in range(self._num_stages)}

    def _step_microbatches(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None,
                           return_outputs=True, loss_kwargs=None):
        if target_mbs is not None or losses is not None:
            raise RuntimeError("Forward-only schedule does not support loss computation")
        return super()._step_microbatches(arg_mbs, kwarg_mbs, None, None, return_outputs)


class ScheduleGPipe(PipelineScheduleSingle):
    """GPipe: every micro-batch's forward, then every backward (fill, then drain)."""

    def _get_pipeline_order(self):
        return {r: orders.gpipe(r, self._num_stages, self._n_microbatches)
                for r in range(self._num_stages)}


class Schedule1F1B(PipelineScheduleSingle):
    """1F1B: a few forwards, then one backward and one forward in turn; a stage holds at
    most ``num_stages - stage`` micro-batches' activations."""

    def __init__(self, stage, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True):
        super().__init__(stage, n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
                         output_merge_spec, scale_grads)
        if n_microbatches < self._num_stages:
            raise ValueError(f"Number of microbatches ({n_microbatches}) must be greater than "
                             f"or equal to the number of stages ({self._num_stages}).")

    def _get_pipeline_order(self):
        return {r: orders.one_f_one_b(r, self._num_stages, self._n_microbatches)
                for r in range(self._num_stages)}


class _PipelineScheduleRuntime(PipelineScheduleMulti):
    """Runs an order given as actions, with its communication: lowered from compute
    actions (``format="compute_only"``) or as given (``"compute_comms"``)."""

    def __init__(self, *args, **kwargs):
        self._defer_pp_recv = kwargs.pop("defer_pp_recv", False)
        super().__init__(*args, **kwargs)
        self.pipeline_order_with_comms = None

    def register_custom_function(self, computation_type, custom_function):
        """Run ``custom_function(action, ctx)`` for every action of ``computation_type``."""
        allowed = (FORWARD, FULL_BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, OVERLAP_F_B,
                   UNSHARD, RESHARD, REDUCE_GRAD)
        if computation_type not in allowed:
            raise ValueError(f"Invalid computation type {computation_type}. Only FORWARD, "
                             "FULL_BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, OVERLAP_F_B, "
                             "UNSHARD, RESHARD and REDUCE_GRAD are supported.")
        if computation_type in self._comp_type_to_function_map:
            log.warning("Computation type %s is already registered. Overwriting the existing "
                        "custom function.", computation_type)
        self._comp_type_to_function_map[computation_type] = custom_function

    def _validate_and_set_stage_mapping(self, actions):
        self._set_stage_to_rank(_validate_schedule(actions, self.pp_group_size,
                                                   self._num_stages, self._n_microbatches))

    def _prepare_schedule_with_comms(self, actions, format="compute_only"):
        """Check ``actions`` ({rank: [actions]}) and make them what each rank runs."""
        self._validate_and_set_stage_mapping(actions)
        rank_of = self.stage_index_to_group_rank.__getitem__
        if format == "compute_comms":
            for rank, items in actions.items():
                if any(a is None for a in items):
                    raise AssertionError("Expected action to be not None, got NoneType")
            self.pipeline_order_with_comms = {r: list(a) for r, a in actions.items()}
            return
        if format != "compute_only":
            raise NotImplementedError(f"format={format!r} is not implemented")
        for rank, items in actions.items():
            for i, a in enumerate(items):
                if a is not None and not a.is_compute_op:
                    raise ValueError(f"Expected compute-only schedule but found communication "
                                     f"action '{a}' at rank {rank}, position {i}. Communication "
                                     "actions (e.g. SEND_F, RECV_F, etc.) should not be present "
                                     "when format='compute_only'.")
        lowered = {r: _add_reduce_grad(_add_unshard_reshard(a), self._n_microbatches)
                   for r, a in actions.items()}
        lowered = _add_send_recv(lowered, rank_of, self._num_stages)
        if self._defer_pp_recv:
            lowered = _defer_recv_ops(lowered, rank_of)
        self.pipeline_order_with_comms = lowered

    def _load_actions(self, actions, format="compute_only"):
        """distgrad's own: run ``actions``, {rank: [actions or their strings]} or CSV text
        (one rank per line, ``"0F0,0F1,0B0,0B1"``)."""
        if isinstance(actions, str):
            actions = parse_actions(actions)
        actions = {int(r): [_Action.from_str(a) if isinstance(a, str) else a for a in items]
                   for r, items in actions.items()}
        if format == "compute_only":
            self.pipeline_order = actions
        self._prepare_schedule_with_comms(actions, format)

    def _load_csv(self, filename, format="compute_only"):
        """Run the order in CSV file ``filename`` (one rank per row)."""
        if format not in ("compute_only", "compute_comms"):
            raise NotImplementedError(f"format={format!r} is not implemented")
        self._load_actions(read_actions_csv(filename), format)

    def _dump_csv(self, filename, format="compute_comms"):
        if format == "compute_only":
            write_actions_csv(filename, self.pipeline_order)
        else:
            if self.pipeline_order_with_comms is None:
                raise AssertionError("Must initialize compute_comms schedule before dump_csv")
            write_actions_csv(filename, self.pipeline_order_with_comms)

    def _simulate(self):
        return _simulate_comms_compute(self.pipeline_order_with_comms,
                                       self.stage_index_to_group_rank.__getitem__,
                                       self._num_stages)

    def _lowered(self):
        if self.pipeline_order_with_comms is None:
            raise AssertionError("Must call _prepare_schedule_with_comms() before calling "
                                 "_step_microbatches()")
        return self.pipeline_order_with_comms

    def _build(self, order_of_rank):
        self.pipeline_order = {r: order_of_rank(r) for r in range(self.pp_group_size)}
        self._prepare_schedule_with_comms(self.pipeline_order)


class ScheduleLoopedBFS(_PipelineScheduleRuntime):
    """Breadth-first (Lamy-Poirier 2022): every micro-batch through a local stage, then
    the next; backwards in reverse."""

    _own_order = True

    def __init__(self, stages, n_microbatches, loss_fn=None, output_merge_spec=None,
                 scale_grads=True, backward_requires_autograd=True, defer_pp_recv=False):
        super().__init__(stages=stages, n_microbatches=n_microbatches, loss_fn=loss_fn,
                         output_merge_spec=output_merge_spec, scale_grads=scale_grads,
                         backward_requires_autograd=backward_requires_autograd,
                         defer_pp_recv=defer_pp_recv)
        self._build(lambda r: orders.looped_bfs(r, self.pp_group_size, len(self._stages),
                                                self._n_microbatches))


class _Interleaved(_PipelineScheduleRuntime):
    _own_order = True

    def __init__(self, stages, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True,
                 backward_requires_autograd=True, defer_pp_recv=False):
        super().__init__(stages=stages, n_microbatches=n_microbatches, loss_fn=loss_fn,
                         args_chunk_spec=args_chunk_spec, kwargs_chunk_spec=kwargs_chunk_spec,
                         output_merge_spec=output_merge_spec, scale_grads=scale_grads,
                         backward_requires_autograd=backward_requires_autograd,
                         defer_pp_recv=defer_pp_recv)
        self.n_local_stages = len(self._stages)
        self.number_of_rounds, self.microbatches_per_round = orders.rounds_of(
            n_microbatches, self.pp_group_size, self._rounds_name)
        self._order()


class ScheduleInterleaved1F1B(_Interleaved):
    """Interleaved 1F1B (Narayanan et al. 2021): several stages per rank, depth first."""

    _rounds_name = "Interleaved 1F1B"

    def _order(self):
        self._build(lambda r: orders.interleaved_1f1b(r, self.pp_group_size, self.n_local_stages,
                                                      self._n_microbatches))


class ScheduleInterleavedZeroBubble(_Interleaved):
    """ZB1P (Qi et al. 2023): interleaved, each backward split into I then W, the W
    passes filling what would be bubbles."""

    _rounds_name = "Zero bubble"

    def _order(self):
        order = orders.interleaved_zero_bubble(self.pp_group_size, self.n_local_stages,
                                               self._n_microbatches)
        self._build(order.__getitem__)


class _V(_PipelineScheduleRuntime):
    """Two stages per rank in a V: rank r holds stages r and 2 * ranks - 1 - r."""

    _own_order = True

    def __init__(self, stages, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True,
                 backward_requires_autograd=True, defer_pp_recv=False):
        if isinstance(stages, (list, tuple)) and len(stages) != 2:
            raise ValueError(f"ZBV requires exactly 2 stages per rank, but got {len(stages)}.")
        super().__init__(stages=stages, n_microbatches=n_microbatches, loss_fn=loss_fn,
                         args_chunk_spec=args_chunk_spec, kwargs_chunk_spec=kwargs_chunk_spec,
                         output_merge_spec=output_merge_spec, scale_grads=scale_grads,
                         backward_requires_autograd=backward_requires_autograd,
                         defer_pp_recv=defer_pp_recv)
        self.n_local_stages = 2
        self.num_stages = self._num_stages
        self._order()

    def _stage_to_rank_mapping(self):
        return generate_stage_to_rank_mapping(self.pp_group_size, self._num_stages, style="v")


class ScheduleZBVZeroBubble(_V):
    """ZB-V (Qi et al. 2023, section 6)."""

    def _order(self):
        self._build(lambda r: orders.zbv_zero_bubble(r, self.pp_group_size, self._num_stages,
                                                     self._n_microbatches))


class ScheduleDualPipeV(_V):
    """DualPipeV (DeepSeek-V3's DualPipe, in a V over half the ranks)."""

    def _order(self):
        if self._n_microbatches < self._num_stages:
            raise ValueError(f"DualPipeV requires at least as many microbatches as stages, but "
                             f"got {self._n_microbatches} microbatches and {self._num_stages} "
                             "stages.")
        self._build(lambda r: orders.dualpipe_v(r, self.pp_group_size, self._n_microbatches))


_SCHEDULES = {"1F1B": Schedule1F1B, "Interleaved1F1B": ScheduleInterleaved1F1B,
              "GPipe": ScheduleGPipe, "LoopedBFS": ScheduleLoopedBFS,
              "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
              "PipelineScheduleSingle": PipelineScheduleSingle,
              "PipelineScheduleMulti": PipelineScheduleMulti,
              "ZBVZeroBubble": ScheduleZBVZeroBubble, "DualPipeV": ScheduleDualPipeV}


def get_schedule_class(schedule_name):
    """The schedule class called ``schedule_name`` (any case): ``"1F1B"``, ``"GPipe"``,
    ``"Interleaved1F1B"``, ``"LoopedBFS"``, ``"InterleavedZeroBubble"``,
    ``"ZBVZeroBubble"``, ``"DualPipeV"``, ..."""
    by_lower = {k.lower(): v for k, v in _SCHEDULES.items()}
    if not isinstance(schedule_name, str) or schedule_name.lower() not in by_lower:
        raise ValueError(f"Unknown schedule name '{schedule_name}'. The valid options are "
                         f"{list(_SCHEDULES)}")
    return by_lower[schedule_name.lower()]
