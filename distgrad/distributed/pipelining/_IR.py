"""Splitting a model into stages: :func:`pipeline` and :class:`SplitPoint`
(``torch.distributed.pipelining._IR``).

PyTorch traces the model (``torch.export``) and cuts its graph where ``split_spec`` or
``pipe_split()`` says. distgrad has no tracer, so it splits what needs none: an
``nn.Sequential``, whose forward calls its children in order, cut before
(``SplitPoint.BEGINNING``) or after (``SplitPoint.END``) the children ``split_spec``
names. Any other model raises, saying so; build its stages by hand with
:class:`PipelineStage`.

>>> import distgrad
>>> from distgrad import nn
>>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
>>> pipe = pipeline(model, mb_args=(distgrad.randn(2, 4),),
...                 split_spec={"2": SplitPoint.BEGINNING})
>>> pipe.num_stages, list(pipe.get_stage_module(1).state_dict())
(2, ['2.weight', '2.bias'])
"""
import enum
from collections import OrderedDict

import distgrad
from distgrad import nn

from ._utils import PipeInfo
from .stage import PipelineStage

__all__ = ["Pipe", "pipe_split", "SplitPoint", "pipeline"]


class SplitPoint(enum.Enum):
    """Where a stage boundary goes, relative to the module named in ``split_spec``."""
    BEGINNING = 1
    END = 2


def pipe_split():
    """PyTorch's in-forward split marker: it needs a tracer, which distgrad lacks."""
    raise NotImplementedError(
        "pipe_split() marks a stage boundary inside a traced forward; distgrad has no tracer: "
        "split an nn.Sequential with pipeline(..., split_spec=...) or build the stages by "
        "hand with PipelineStage")


class Pipe(nn.Module):
    """A model split into stages: ``split_gm.submod_<i>`` is stage ``i``'s module."""

    def __init__(self, stage_modules, has_loss_and_backward=False):
        super().__init__()
        self.split_gm = nn.Module()
        for i, m in enumerate(stage_modules):
            self.split_gm.add_module(f"submod_{i}", m)
        self.num_stages = len(stage_modules)
        self.has_loss_and_backward = has_loss_and_backward

    def forward(self, *args, **kwargs):
        """The whole model, stage after stage, in this process."""
        out = args
        for i in range(self.num_stages):
            out = self.get_stage_module(i)(*out, **(kwargs if i == 0 else {}))
            out = out if isinstance(out, tuple) else (out,)
        return out

    def get_stage_module(self, stage_idx):
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"Invalid stage index {stage_idx}!")
        return getattr(self.split_gm, f"submod_{stage_idx}")

    def info(self):
        return PipeInfo(self.split_gm, self.num_stages, self.has_loss_and_backward)

    def build_stage(self, stage_index, device=None, group=None):
        """This rank's stage ``stage_index`` of the split model."""
        return PipelineStage(self.get_stage_module(stage_index), stage_index, self.num_stages,
                             device, group=group)


def _cut_points(names, split_spec):
    """Indices of the children that start a stage (after the first)."""
    cuts = set()
    for qualname, point in split_spec.items():
        if qualname not in names:
            raise ValueError(
                f"split_spec names {qualname!r}, which is not a child of the nn.Sequential "
                f"(its children: {', '.join(names)}); without a tracer, distgrad splits "
                "between children only")
        if not isinstance(point, SplitPoint):
            raise TypeError(f"split_spec[{qualname!r}] must be a SplitPoint, got {point!r}")
        i = names.index(qualname)
        cut = i if point == SplitPoint.BEGINNING else i + 1
        if 0 < cut < len(names):
            cuts.add(cut)
    return sorted(cuts)


def pipeline(module, mb_args, mb_kwargs=None, split_spec=None, split_policy=None):
    """Split ``module`` (an ``nn.Sequential``) into stages at ``split_spec``
    ({child name: SplitPoint}); ``mb_args`` is one micro-batch's input, run through the
    stages once to check they chain."""
    if split_policy is not None:
        raise NotImplementedError("split_policy works on a traced graph; distgrad has no "
                                  "tracer: give split_spec")
    if not isinstance(module, nn.Sequential) or type(module).forward is not \
            nn.Sequential.forward:
        raise NotImplementedError(
            f"pipeline() needs a tracer to split {type(module).__name__}, and distgrad has "
            "none: it splits nn.Sequential models (children called in order) only. Build the "
            "stages of other models by hand with PipelineStage(module_part, stage_index, "
            "num_stages, device)")
    items = list(module.named_children())
    names = [name for name, _ in items]
    bounds = [0] + _cut_points(names, split_spec or {}) + [len(items)]
    stages = [nn.Sequential(OrderedDict(items[a:b])) for a, b in zip(bounds, bounds[1:])]
    pipe = Pipe(stages)
    if mb_args is not None:  # as PyTorch's trace does: the micro-batch must go through
        args = mb_args if isinstance(mb_args, tuple) else (mb_args,)
        with distgrad.no_grad():
            pipe(*args, **(mb_kwargs or {}))
    return pipe
