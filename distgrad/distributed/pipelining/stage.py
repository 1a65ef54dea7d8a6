"""A pipeline stage: one slice of the model on one rank (``PipelineStage``).

A stage runs its module on one micro-batch at a time (``forward_one_chunk``), keeps
what the backward needs, and runs the backward whole (``backward_one_chunk``) or split
into the inputs' part and the weights' part (zero-bubble schedules, see
``_backward.py``). A schedule (``schedules.py``) decides the order and moves the
activations and gradients between ranks; between two stages of one rank (V schedules)
they pass directly.

Shapes. The first micro-batch a stage sees sets each tensor's contract (dtype and number
of dimensions); sizes are free after that, since messages carry their shapes: an uneven
last micro-batch and batches whose size changes from step to step just work (PyTorch
receives into buffers sized once and fails on both). ``input_args`` / ``output_args``
declare exact shapes: the schedule's first step checks them against the neighbours'
(:class:`PipeliningShapeError` naming both stages and both shapes), and every
micro-batch against them.
"""
import numpy as np

import distgrad
from distgrad import nn
from distgrad.autograd import Tensor
from distgrad.autograd._internal import array_of
from distgrad.distributed.collectives import all_reduce
from distgrad.distributed.reduce_op import ReduceOp
from distgrad.nn.parallel import DistributedDataParallel

from ._backward import stage_backward, stage_backward_input, stage_backward_weight
from ._utils import PipeInfo, PipeliningShapeError, TensorMeta, check_metas, flatten_args
from .channel import ProcessGroupChannel

__all__ = ["PipelineStage", "build_stage"]


def _as_tuple(output):
    """A module's output as a tuple of values (a lone tensor becomes a 1-tuple)."""
    if isinstance(output, (tuple, list)):
        return tuple(output)
    return (output,)


def _metas(tensors):
    return tuple(TensorMeta.of(t) if isinstance(t, Tensor) else None for t in tensors)


def _declared(args, what):
    if args is None:
        return None
    values = _as_tuple(args)
    for v in values:
        if not isinstance(v, Tensor):
            raise PipeliningShapeError(f"{what} must be tensors, got {type(v).__name__}")
    return _metas(values)


class PipelineStage:
    """Stage ``stage_index`` of ``num_stages`` of a pipeline, holding ``submodule``.

    ``input_args`` / ``output_args`` (a tensor or a tuple of them, one micro-batch's) are
    optional declarations of exact shapes. ``group``: the process group of the pipeline
    (default: the default group); stage ``s`` lives on its rank ``s % size`` unless the
    schedule says otherwise (V schedules). ``dw_builder``: called once per micro-batch
    for a function that computes the weights' gradients, for modules with their own
    split backward.
    """

    def __init__(self, submodule, stage_index, num_stages, device=None, input_args=None,
                 output_args=None, output_grads=None, input_grads=None, group=None,
                 dw_builder=None, get_mesh=None, *, _channel=None):
        if stage_index >= num_stages:
            raise ValueError(f"Stage index {stage_index} is out of range of {num_stages}")
        if not isinstance(submodule, nn.Module):
            raise TypeError(f"submodule must be an nn.Module, got {type(submodule).__name__}")
        self.submod, self.stage_index, self.num_stages = submodule, stage_index, num_stages
        self.device, self.group, self.dw_builder = device, group, dw_builder
        self.channel = _channel if _channel is not None else ProcessGroupChannel(group)
        self.group_rank, self.group_size = self.channel.rank, self.channel.size
        if self.group_size > num_stages:
            raise RuntimeError(f"Pipeline group size {self.group_size} cannot be larger than "
                               f"number of stages {num_stages}")
        self.stage_index_to_group_rank = {i: i % self.group_size for i in range(num_stages)}
        self.declared_inputs = _declared(input_args, "input_args")
        self.declared_outputs = _declared(output_args, "output_args")
        self.inputs_meta = self.declared_inputs    # set by the first micro-batch otherwise
        self.outputs_meta = self.declared_outputs
        self.next_declared_inputs = None  # the next stage's input_args (the handshake's)
        self.has_backward = False
        self.chunks = None
        self.log_prefix = f"[Stage {stage_index}]"
        self.wrap_errors = True  # PyTorch's RuntimeError around a failed forward
        self.fwd_cache, self.bwd_cache, self.output_chunks = {}, {}, []
        self.backward_state, self.dw_runner = {}, {}
        self._inputs, self._output_grads = {}, {}

    # -- place --
    @property
    def is_first(self):
        return self.stage_index == 0

    @property
    def is_last(self):
        return self.stage_index == self.num_stages - 1

    def _check_chunk_id(self, chunk_id):
        if self.chunks is None:
            raise RuntimeError("Attempted to access chunk_id before chunks have been "
                               "configured.")
        if chunk_id >= self.chunks:
            raise RuntimeError(f"Chunk id {chunk_id} is out of range [0, {self.chunks})")

    def clear_runtime_states(self):
        """Forget the last step's micro-batches (a step starts with this)."""
        self.fwd_cache.clear()
        self.bwd_cache.clear()
        self.output_chunks.clear()
        self._inputs.clear()
        self._output_grads.clear()
        self.backward_state.clear()
        self.dw_runner.clear()

    # -- inputs from the stage before --
    def set_local_fwd_input(self, prev_stage_outputs, mb_index):
        """The outputs of the stage before, on this rank (V schedules): fresh leaves."""
        values = [t.detach() if isinstance(t, Tensor) else t
                  for t in _as_tuple(prev_stage_outputs)]
        flags = [isinstance(t, Tensor) and t.requires_grad for t in _as_tuple(prev_stage_outputs)]
        self._inputs[mb_index] = (values, flags)

    def accept_activation(self, mb_index, value, sender):
        """An activation message from stage ``stage_index - 1`` (on rank ``sender``)."""
        if not (isinstance(value, list) and len(value) == 2 and
                all(isinstance(v, list) for v in value) and len(value[0]) == len(value[1]) and
                all(isinstance(a, np.ndarray) for a in value[0])):
            raise RuntimeError(f"stage {self.stage_index}: a malformed activation of "
                               f"micro-batch {mb_index} from rank {sender}")
        arrays, flags = value
        got = tuple(TensorMeta(a.shape, a.dtype.name) for a in arrays)
        if self.declared_inputs is not None:  # the sender checked too; say it here as well
            check_metas(self.declared_inputs, got, True,
                        f"stage {self.stage_index} (its input_args) received from stage "
                        f"{self.stage_index - 1} (rank {sender}) micro-batch {mb_index}")
        self._inputs[mb_index] = (arrays, list(flags))

    def outgoing_activation(self, mb_index):
        """The message of micro-batch ``mb_index``'s outputs, for the next stage."""
        outputs, _ = self.fwd_cache[mb_index]
        for i, o in enumerate(outputs):
            if not isinstance(o, Tensor):
                raise PipeliningShapeError(f"stage {self.stage_index} output {i} is a "
                                           f"{type(o).__name__}: stages pass tensors only")
        return [[np.ascontiguousarray(array_of(o)) for o in outputs],
                [bool(o.requires_grad) for o in outputs]]

    def _input_tensors(self, mb_index):
        values, flags = self._inputs.pop(mb_index)
        grad = self.has_backward and distgrad.is_grad_enabled()
        out = []
        for v, f in zip(values, flags):
            if isinstance(v, np.ndarray):  # received: a read-only view of the message is
                # kept as it is where autograd forbids writing into it anyway (a leaf that
                # requires grad); copied where the module may write into its input
                keep = v.flags.writeable or (f and grad and v.dtype.kind in "fc")
                v = distgrad.from_numpy(v if keep else np.array(v))
            if isinstance(v, Tensor) and v.is_floating_point():
                v = v.requires_grad_(bool(f) and grad)
            out.append(v)
        return tuple(out)

    # -- gradients from the stage after --
    def set_local_bwd_input(self, next_stage_bwd_outputs, mb_index):
        if not isinstance(next_stage_bwd_outputs, tuple):
            raise AssertionError(f"Expected tuple, got {type(next_stage_bwd_outputs)}")
        self._output_grads[mb_index] = next_stage_bwd_outputs

    def accept_grads(self, mb_index, value, sender):
        if not (isinstance(value, list) and
                all(a is None or isinstance(a, np.ndarray) for a in value)):
            raise RuntimeError(f"stage {self.stage_index}: a malformed gradient of "
                               f"micro-batch {mb_index} from rank {sender}")
        self._output_grads[mb_index] = tuple(
            None if a is None else distgrad.from_numpy(a if a.flags.writeable else np.array(a))
            for a in value)

    def get_local_bwd_output(self, mb_index):
        """The gradients of micro-batch ``mb_index``'s inputs, for the stage before."""
        if not self.has_backward:
            raise AssertionError("can't steal_bwd_input if this stage doesn't have backward")
        if self.is_first:
            raise AssertionError("can't get bwd output if this stage is first")
        self._check_chunk_id(mb_index)
        return self.bwd_cache.pop(mb_index)

    def outgoing_grads(self, mb_index):
        return [None if g is None else np.ascontiguousarray(array_of(g))
                for g in self.get_local_bwd_output(mb_index)]

    # -- forward --
    def _forward(self, args, kwargs, mb_index):
        """The module on one micro-batch (a place for subclasses to wrap it)."""
        if isinstance(self.submod, DistributedDataParallel):
            with self.submod.no_sync():  # replicas average once, at REDUCE_GRAD
                return self.submod(*args, **kwargs)
        return self.submod(*args, **kwargs)

    def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
        """Run the module on micro-batch ``fwd_chunk_id``: ``args`` on the first stage,
        what the stage before sent on the others; returns the module's output."""
        args = tuple(args) if self.is_first else self._input_tensors(fwd_chunk_id)
        kwargs = kwargs or {}
        self._check_contract("inputs", args, fwd_chunk_id)
        try:
            output = self._forward(args, kwargs, fwd_chunk_id)
        except Exception as e:
            if not self.wrap_errors:
                raise
            raise RuntimeError(f"{self.log_prefix} failed to run forward:\nargs: "
                               f"{_describe(args)}\nkwargs: {_describe(kwargs)}") from e
        outputs = _as_tuple(output)
        if self.is_last and save_forward_output:
            self.output_chunks.append(output)
        self.fwd_cache[fwd_chunk_id] = (outputs, flatten_args(args) + flatten_args(kwargs))
        if not self.is_last:
            self._check_contract("outputs", outputs, fwd_chunk_id)
        return output

    def _check_contract(self, side, tensors, mb):
        got = _metas(tensors)
        declared = self.declared_inputs if side == "inputs" else self.declared_outputs
        current = self.inputs_meta if side == "inputs" else self.outputs_meta
        if current is None:  # the first micro-batch sets the contract
            if side == "inputs":
                self.inputs_meta = got
            else:
                self.outputs_meta = got
            current = got
        where = f"Stage {self.stage_index} forward {side}, micro-batch {mb}"
        check_metas(current, got, declared is not None, where)
        if side == "outputs" and self.next_declared_inputs is not None:
            check_metas(self.next_declared_inputs, got, True,
                        f"stage {self.stage_index} output for stage {self.stage_index + 1} "
                        f"(its input_args), micro-batch {mb}")

    # -- backward --
    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                           last_backward=False):
        """The backward of micro-batch ``bwd_chunk_id`` (from ``loss`` on the last stage,
        from the next stage's gradients elsewhere); with ``full_backward=False`` only the
        inputs' part, :meth:`backward_weight_one_chunk` does the rest."""
        if not self.has_backward:
            return
        self._check_chunk_id(bwd_chunk_id)
        outputs, inputs = self.fwd_cache.pop(bwd_chunk_id)
        if self.is_last:
            roots, grads = loss, None
        else:
            roots, grads = outputs, self._output_grads.pop(bwd_chunk_id)
        try:
            if self.dw_builder is not None:
                grads_in = stage_backward(roots, grads, inputs)
                if full_backward:
                    self.dw_builder()()
                else:
                    self.dw_runner[bwd_chunk_id] = self.dw_builder()
            elif full_backward:
                grads_in = stage_backward(roots, grads, inputs)
            elif self.is_first:  # nobody waits for the first stage's inputs: all at W
                grads_in = ()
                self.backward_state[bwd_chunk_id] = (roots, grads, inputs)
                self.dw_runner[bwd_chunk_id] = None
            else:
                grads_in, groups = stage_backward_input(
                    roots if isinstance(roots, (tuple, list)) else (roots,), grads, inputs,
                    self.submod.parameters())
                self.backward_state[bwd_chunk_id] = groups
                self.dw_runner[bwd_chunk_id] = None
        except Exception as e:
            if not self.wrap_errors:
                raise
            raise RuntimeError(f"{self.log_prefix} failed to run backward of micro-batch "
                               f"{bwd_chunk_id}") from e
        n = len(self.inputs_meta or ())
        self.bwd_cache[bwd_chunk_id] = tuple(grads_in[:n])

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        """The weights' part of a backward that ``backward_one_chunk(...,
        full_backward=False)`` began."""
        if not self.has_backward:
            return
        if bwd_chunk_id not in self.dw_runner:
            raise AssertionError(f"{self.log_prefix} Attempted to run backward_weight_one_chunk "
                                 f"for chunk {bwd_chunk_id} without first calling "
                                 "`backward_one_chunk(full_backward=False)`")
        runner = self.dw_runner.pop(bwd_chunk_id)
        if runner is not None:
            runner()
            return
        state = self.backward_state.pop(bwd_chunk_id)
        if isinstance(state, tuple):  # the first stage: its whole backward
            stage_backward(*state)
        else:
            stage_backward_weight(self.submod.parameters(), state)

    # -- end of a step --
    def scale_grads(self, grad_scale_factor):
        """Divide the parameters' gradients by ``grad_scale_factor`` (the number of
        micro-batches for a loss that averages; 1 for one that sums)."""
        if grad_scale_factor != 1:
            for p in self.submod.parameters():
                if p.grad is not None:
                    p.grad.div_(grad_scale_factor)

    def perform_reduce_grad(self, grad_scale_factor):
        """After the stage's last backward of a step: data-parallel replicas (a
        DistributedDataParallel submodule) average their gradients here, whatever the
        schedule (its zero-bubble W passes too), then the gradients are scaled."""
        if isinstance(self.submod, DistributedDataParallel):
            self._average_replicas()
        self.scale_grads(grad_scale_factor)

    def _average_replicas(self):
        params = [p for p in self.submod.parameters() if p.requires_grad]
        by_dtype = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        with distgrad.no_grad():
            for ps in by_dtype.values():
                flat = distgrad.cat([(p.grad if p.grad is not None else distgrad.zeros_like(p))
                                     .reshape(-1) for p in ps])
                all_reduce(flat, op=ReduceOp.AVG, group=self.submod.process_group)
                at = 0
                for p in ps:
                    n = p.numel()
                    p.grad = flat[at:at + n].reshape(p.shape).clone()
                    at += n


def _describe(values):
    def one(v):
        return f"Tensor{tuple(v.shape)}:{v.dtype}" if isinstance(v, Tensor) else repr(v)[:40]
    if isinstance(values, dict):
        return "{" + ", ".join(f"{k}: {one(v)}" for k, v in values.items()) + "}"
    return "(" + ", ".join(one(v) for v in values) + ")"


def build_stage(stage_module, stage_index, pipe_info, device=None, group=None):
    """A stage of a split model (:func:`pipeline`'s ``Pipe.info()`` gives ``pipe_info``)."""
    if not isinstance(pipe_info, PipeInfo):
        raise TypeError(f"pipe_info must be a PipeInfo (Pipe.info()), got "
                        f"{type(pipe_info).__name__}")
    return PipelineStage(stage_module, stage_index, pipe_info.num_stages, device, group=group)
