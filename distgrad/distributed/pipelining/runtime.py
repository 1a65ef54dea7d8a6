"""Running a schedule: the step API of every schedule class, and the one executor that
runs a rank's list of actions (``torch.distributed.pipelining.schedules``' base classes).

Every schedule, single-stage or not, runs the same way: its compute order is lowered
to include the sends and receives between ranks (``lowering._add_send_recv``, as
PyTorch's ``_PipelineScheduleRuntime`` does), and the executor walks this rank's list.
Each step first posts every receive the list holds, so a send never waits for its
receiver and no order of the ranks' lists can deadlock; a send leaves as soon as its
action is reached.

When an action fails, the rank sends a failure notice in place of every message it still
owed in the step, so its neighbours raise at once, naming the stage that failed, instead
of waiting for the process group's timeout.
"""
import logging
from contextlib import nullcontext

import distgrad
from distgrad.autograd import Tensor

from ._utils import (PipeliningShapeError, StageFailedError, StageShapeFailedError,
                     generate_stage_to_rank_mapping, tree_map)
from .actions import (B, F, I, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B, SEND_F, UNSHARD,
                      W, _format_pipeline_order, leaves, read_actions_csv, write_actions_csv)
from .handshake import handshake
from .lowering import _add_reduce_grad, _add_send_recv, _validate_schedule
from .microbatch import _split_tensor, TensorChunkSpec, merge_chunks, \
    split_args_kwargs_into_chunks

__all__ = ["_PipelineSchedule", "PipelineScheduleSingle", "PipelineScheduleMulti",
           "_PipelineContext"]

log = logging.getLogger(__name__)
_TARGET_SPEC = TensorChunkSpec(0)
_FAILED = "pipeline_failed"


class _PipelineSchedule:
    """What every schedule does around its actions: split the batch, compute the last
    stage's losses, merge its outputs, hand back the losses."""

    def __init__(self, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True):
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, int) or \
                n_microbatches < 1:
            raise ValueError(f"n_microbatches must be a positive int, got {n_microbatches!r}")
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self.scale_grads = scale_grads
        self._args_chunk_spec, self._kwargs_chunk_spec = args_chunk_spec, kwargs_chunk_spec
        self._output_merge_spec = output_merge_spec
        self._has_backward = loss_fn is not None
        self._internal_losses = {}
        self._introduced = False          # the neighbours' handshake is done
        self._action_observer = None      # ``(rank, action) -> context manager`` (traces)
        self._comp_type_to_function_map = {}

    # -- the public API --
    def step(self, *args, target=None, losses=None, return_outputs=True, loss_kwargs=None,
             **kwargs):
        """One step on the whole batch: split into micro-batches, run them as the schedule
        says; the last stage returns the merged output (when ``return_outputs``)."""
        if self._has_backward and getattr(self, "_backward_requires_autograd", True) and \
                not distgrad.is_grad_enabled():
            raise RuntimeError("step() requires gradients to be enabled for backward "
                               "computation; it should not be used under torch.no_grad() "
                               "context. Please call eval() instead.")
        self._prepare_stages()
        args_split, kwargs_split = self._split_inputs(args, kwargs)
        targets = (list(_split_tensor(target, _TARGET_SPEC, self._n_microbatches))
                   if target is not None else None)
        self._step_microbatches(args_split, kwargs_split, targets, losses, return_outputs,
                                loss_kwargs=loss_kwargs)
        for stage in self._stages:
            if stage.is_last and return_outputs:
                return self._merge_outputs(stage.output_chunks)
        return None

    def _prepare_stages(self):
        """What a step does before its micro-batches (``_step_microbatches`` follows)."""
        for stage in self._stages:
            stage.has_backward = self._has_backward
            stage.chunks = self._n_microbatches
            stage.clear_runtime_states()

    def eval(self, *args, target=None, losses=None, **kwargs):
        """Forward passes only (losses too, with a target); no backward."""
        saved = self._has_backward
        try:
            self._has_backward = False
            return self.step(*args, target=target, losses=losses, **kwargs)
        finally:
            self._has_backward = saved

    # -- around the actions --
    def _check_inputs(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None):
        def check(mbs, name):
            if not isinstance(mbs, list):
                raise TypeError(f"{name} must be a list but got a {type(mbs)}")
            if len(mbs) != self._n_microbatches:
                raise ValueError(f"Expecting {self._n_microbatches} {name} but got {len(mbs)}")
        if arg_mbs is not None:
            check(arg_mbs, "arg_mbs")
        else:
            arg_mbs = [()] * self._n_microbatches
        if kwarg_mbs is not None:
            check(kwarg_mbs, "kwarg_mbs")
        else:
            kwarg_mbs = [{}] * self._n_microbatches
        if target_mbs is not None:
            check(target_mbs, "target_mbs")
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list but got a {type(losses)}")
        return arg_mbs, kwarg_mbs

    def _split_inputs(self, args, kwargs=None):
        if args or kwargs:
            return split_args_kwargs_into_chunks(args, kwargs, self._n_microbatches,
                                                 self._args_chunk_spec, self._kwargs_chunk_spec)
        return [()] * self._n_microbatches, [{}] * self._n_microbatches

    def _merge_outputs(self, output_chunks):
        if self._has_backward:  # returned to the user: the graph behind them is spent
            output_chunks = [tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, c)
                             for c in output_chunks]
        return merge_chunks(output_chunks, self._output_merge_spec)

    def _compute_loss(self, output, target, loss_kwargs=None):
        return self._loss_fn(output, target, **(loss_kwargs or {}))

    def _maybe_compute_loss(self, stage, output, target_mbs, mb_index, loss_kwargs=None):
        if stage.is_last and self._loss_fn is not None:
            if target_mbs is None:
                raise RuntimeError(f"stage {stage.stage_index} is the last and the schedule has "
                                   "a loss_fn, but step() got no target")
            self._internal_losses[mb_index] = self._compute_loss(output, target_mbs[mb_index],
                                                                 loss_kwargs)

    def _maybe_get_loss(self, stage, mb_index):
        if stage.is_last and self._loss_fn is not None:
            if mb_index not in self._internal_losses:
                raise RuntimeError(f"Loss for microbatch {mb_index} is not available. "
                                   f"Available losses for microbatches: "
                                   f"{sorted(self._internal_losses)}")
            return self._internal_losses[mb_index]
        return None

    def _update_losses(self, stages, losses):
        if any(s.is_last for s in stages) and losses is not None:
            if len(self._internal_losses) != self._n_microbatches:
                raise RuntimeError(f"Expecting {self._n_microbatches} losses but got "
                                   f"{len(self._internal_losses)}")
            losses.clear()
            losses.extend(self._internal_losses[i] for i in range(self._n_microbatches))
        self._internal_losses.clear()

    # -- the executor --
    def _lowered(self):
        """Every rank's actions with communication (the subclasses lower their orders)."""
        raise NotImplementedError

    def _rank_actions(self):
        return self._lowered()[self.rank]

    def _step_microbatches(self, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None,
                           return_outputs=True, loss_kwargs=None):
        """Run this rank's actions on the given micro-batches."""
        arg_mbs, kwarg_mbs = self._check_inputs(arg_mbs, kwarg_mbs, target_mbs, losses)
        actions = self._rank_actions()
        run = _Run(self, arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs)
        run.post_receives(actions)
        if not self._introduced:
            try:
                handshake(self)
            except BaseException as e:
                run.fail_sends(actions, e)
                raise
            self._introduced = True
        for i, action in enumerate(actions):
            try:
                run.perform(action)
            except BaseException as e:
                run.fail_sends(actions[i:], e)
                self._internal_losses.clear()
                log.error("rank %d: %s failed at action %d (%s) of its list:\n%s", self.rank,
                          type(self).__name__, i, action,
                          _format_pipeline_order(self._lowered(), error_step_number=i))
                raise
        self._update_losses(self._stages, losses)


class _PipelineContext:
    """What a custom function registered for an action type gets besides the action."""

    def __init__(self, schedule_ref, arg_mbs=None, kwarg_mbs=None, target_mbs=None,
                 losses=None):
        self.schedule_ref, self.arg_mbs, self.kwarg_mbs = schedule_ref, arg_mbs, kwarg_mbs
        self.target_mbs, self.losses = target_mbs, losses


class _Run:
    """One step of one rank: its posted receives and the stages' progress."""

    def __init__(self, schedule, arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs,
                 loss_kwargs):
        self.s = schedule
        self.stages = {st.stage_index: st for st in schedule._stages}
        self.channel = schedule._stages[0].channel
        self.args, self.kwargs, self.targets = arg_mbs, kwarg_mbs, target_mbs
        self.losses, self.return_outputs, self.loss_kwargs = losses, return_outputs, loss_kwargs
        self.train = schedule._has_backward
        self.rank_of = schedule.stage_index_to_group_rank.__getitem__
        self.posted = {}

    def post_receives(self, actions):
        for a in actions:
            kind, s, mb = a.computation_type, a.stage_index, a.microbatch_index
            if kind == RECV_F:
                key = ("act", s, mb)
                self.posted[key] = self.channel.post(key, self.rank_of(s - 1))
            elif kind == RECV_B and self.train:
                key = ("grad", s, mb)
                self.posted[key] = self.channel.post(key, self.rank_of(s + 1))

    def _take(self, key, peer_stage):
        peer = self.rank_of(peer_stage)
        if key not in self.posted:  # an order given with its communication, lacking a RECV
            what = "F" if key[0] == "act" else "B/I"
            raise AssertionError(f"Computing {key[1]}{what}{key[2]} before receiving its input: "
                                 f"the order has no RECV of it on rank {self.s.rank}")
        value = self.channel.take(self.posted.pop(key), key, peer)
        if isinstance(value, dict) and _FAILED in value:
            kind, text = value[_FAILED]
            shape = kind in ("PipeliningShapeError", "StageShapeFailedError")
            cls = StageShapeFailedError if shape else StageFailedError
            raise cls(f"stage {peer_stage} (rank {peer}) failed, so stage {key[1]} gets no "
                      f"{key[0]} for micro-batch {key[2]}: {kind}: {text}")
        return value

    def perform(self, action):
        custom = self.s._comp_type_to_function_map.get(action.computation_type)
        if custom is not None:
            custom(action, _PipelineContext(self.s, self.args, self.kwargs, self.targets,
                                            self.losses))
            return
        for a in leaves(action):
            self._one(a)

    def _computing(self, a):
        """The observer's context around an action's computation (not its waiting)."""
        observe = self.s._action_observer
        return observe(self.s.rank, a) if observe is not None else nullcontext()

    def _one(self, a):
        kind, s, mb = a.computation_type, a.stage_index, a.microbatch_index
        if kind in (UNSHARD, RESHARD, RECV_F, RECV_B):
            return  # no FSDP here; receives were posted when the step began
        stage = self.stages.get(s)
        if stage is None:
            raise RuntimeError(f"rank {self.s.rank} has no stage {s} for action {a} (it holds "
                               f"stages {sorted(self.stages)})")
        if kind == F:
            if not stage.is_first and s - 1 not in self.stages:
                stage.accept_activation(mb, self._take(("act", s, mb), s - 1), self.rank_of(s - 1))
            with self._computing(a):
                out = stage.forward_one_chunk(mb, self.args[mb], self.kwargs[mb],
                                              save_forward_output=self.return_outputs)
                self.s._maybe_compute_loss(stage, out, self.targets, mb, self.loss_kwargs)
            if s + 1 in self.stages:
                self.stages[s + 1].set_local_fwd_input(out, mb)
        elif kind == SEND_F:
            self.channel.send(("act", s + 1, mb), self.rank_of(s + 1),
                              stage.outgoing_activation(mb))
        elif not self.train:
            return  # evaluation: nothing backward
        elif kind in (B, I):
            if not stage.is_last and s + 1 not in self.stages:
                stage.accept_grads(mb, self._take(("grad", s, mb), s + 1), self.rank_of(s + 1))
            with self._computing(a):
                stage.backward_one_chunk(mb, loss=self.s._maybe_get_loss(stage, mb),
                                         full_backward=kind == B)
            if s - 1 in self.stages:
                self.stages[s - 1].set_local_bwd_input(stage.get_local_bwd_output(mb), mb)
        elif kind == SEND_B:
            self.channel.send(("grad", s - 1, mb), self.rank_of(s - 1), stage.outgoing_grads(mb))
        elif kind == W:
            with self._computing(a):
                stage.backward_weight_one_chunk(mb)
        elif kind == REDUCE_GRAD:
            stage.perform_reduce_grad(self.s._n_microbatches if self.s.scale_grads else 1)
        else:
            raise ValueError(f"action={a} is unknown or unsupported")

    def fail_sends(self, remaining, error):
        """A failure notice in place of each message still owed in this step."""
        text = str(error)
        if error.__cause__ is not None:
            text += f" (from {type(error.__cause__).__name__}: {error.__cause__})"
        notice = {_FAILED: [type(error).__name__, text]}
        for action in remaining:
            for a in leaves(action):
                kind, s, mb = a.computation_type, a.stage_index, a.microbatch_index
                try:
                    if kind == SEND_F:
                        self.channel.send(("act", s + 1, mb), self.rank_of(s + 1), notice)
                    elif kind == SEND_B and self.train:
                        self.channel.send(("grad", s - 1, mb), self.rank_of(s - 1), notice)
                except Exception:  # noqa: BLE001 - the group broke: the error says enough
                    return


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule of one stage per rank (``stage`` on rank ``stage.stage_index``).

    ``scale_grads=True`` divides the gradients by the number of micro-batches at the end
    of the step: right for a loss that averages; pass False for one that sums.
    """

    def __init__(self, stage, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, scale_grads=True):
        super().__init__(n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
                         output_merge_spec, scale_grads)
        if isinstance(stage, (list, tuple)):
            raise TypeError(f"{type(self).__name__} runs one stage per rank and takes a "
                            f"PipelineStage, not a {type(stage).__name__}: several stages per "
                            "rank need a multi-stage schedule (ScheduleInterleaved1F1B, ...)")
        self._stage, self._stages = stage, [stage]
        self._num_stages = stage.num_stages
        self.rank, self.pp_group_size = stage.group_rank, stage.group_size
        if stage.group_size != stage.num_stages:
            raise ValueError(
                f"{type(self).__name__} runs one stage per rank, but the pipeline has "
                f"{stage.num_stages} stages (num_stages of stage {stage.stage_index}) on "
                f"{stage.group_size} ranks: give each rank its stages in a list to a "
                "multi-stage schedule (ScheduleInterleaved1F1B, ScheduleLoopedBFS, ...)")
        if stage.stage_index != stage.group_rank:
            raise ValueError(f"{type(self).__name__}: stage {stage.stage_index} is on rank "
                             f"{stage.group_rank}, but stage i runs on rank i")
        self.stage_index_to_group_rank = {i: i for i in range(self._num_stages)}
        stage.stage_index_to_group_rank = self.stage_index_to_group_rank
        self.pipeline_order = self._get_pipeline_order()
        self._with_comms = None

    def _get_pipeline_order(self):
        return None

    def _lowered(self):
        if self._with_comms is None:
            if self.pipeline_order is None:
                raise NotImplementedError(f"{type(self).__name__} defines no pipeline order")
            orders = {r: [a for a in items if a is not None]  # REDUCE_GRAD is in already
                      for r, items in self.pipeline_order.items()}
            self._with_comms = _add_send_recv(orders, lambda s: s, self._num_stages)
        return self._with_comms


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank (``stages``: this rank's, in order)."""

    _own_order = False  # True: the class computes its order, the same count on every rank

    def __init__(self, stages, n_microbatches, loss_fn=None, args_chunk_spec=None,
                 kwargs_chunk_spec=None, output_merge_spec=None, use_full_backward=None,
                 scale_grads=True, backward_requires_autograd=True):
        super().__init__(n_microbatches, loss_fn, args_chunk_spec, kwargs_chunk_spec,
                         output_merge_spec, scale_grads)
        if not isinstance(stages, (list, tuple)) or not stages:
            raise TypeError(f"{type(self).__name__} takes a non-empty list of this rank's "
                            f"PipelineStages, got {type(stages).__name__}")
        self._stages = list(stages)
        self._num_stages = stages[0].num_stages
        self.pp_group_size, self.rank = stages[0].group_size, stages[0].group_rank
        for st in self._stages:
            if st.num_stages != self._num_stages:
                raise ValueError(f"{type(self).__name__}: the stages of rank {self.rank} "
                                 f"disagree on num_stages ({st.num_stages} and "
                                 f"{self._num_stages})")
        self._backward_requires_autograd = backward_requires_autograd
        if not self._own_order:  # the order (and where stages live) comes with the actions
            self.stage_index_to_group_rank = self._stage_to_rank_mapping()
        elif self._num_stages != self.pp_group_size * len(self._stages):
            raise ValueError(
                f"{type(self).__name__}: {self.pp_group_size} ranks with {len(self._stages)} "
                f"stages each make {self.pp_group_size * len(self._stages)} stages, but the "
                f"stages say num_stages={self._num_stages}")
        else:
            self._set_stage_to_rank(self._stage_to_rank_mapping())
        self.pipeline_order = {}
        self._with_comms = None

    def _stage_to_rank_mapping(self):
        return generate_stage_to_rank_mapping(self.pp_group_size, self._num_stages)

    def _set_stage_to_rank(self, mapping):
        self.stage_index_to_group_rank = mapping
        for st in self._stages:
            if mapping.get(st.stage_index) != self.rank:
                placed = sorted(s for s, r in mapping.items() if r == self.rank)
                raise ValueError(f"{type(self).__name__} places stages {placed} on rank "
                                 f"{self.rank}, but this rank was given stage {st.stage_index}")
            st.stage_index_to_group_rank = mapping

    def _lowered(self):
        if self._with_comms is None:
            orders = {r: _add_reduce_grad(a, self._n_microbatches)
                      for r, a in self.pipeline_order.items()}
            self._with_comms = _add_send_recv(orders, self.stage_index_to_group_rank.__getitem__,
                                              self._num_stages)
        return self._with_comms

    def _load_csv(self, filename, format="compute_only"):
        """Run the compute order in CSV file ``filename`` (one rank per row)."""
        if format != "compute_only":
            raise AssertionError(f'format must be "compute_only", got {format}')
        self.pipeline_order = read_actions_csv(filename)
        self._set_stage_to_rank(_validate_schedule(self.pipeline_order, self.pp_group_size,
                                                   self._num_stages, self._n_microbatches))
        self._with_comms = None

    def _dump_csv(self, filename):
        write_actions_csv(filename, self.pipeline_order)
