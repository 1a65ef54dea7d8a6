"""The schedule IR: one action per entry of a rank's list, written ``2F0`` (stage 2,
forward, micro-batch 0), as in ``torch.distributed.pipelining.schedules``.

>>> _Action.from_str("1W3")
1W3
>>> _Action.from_str("(0F2;1B1)OVERLAP_F_B").sub_actions
(0F2, 1B1)

Compute actions: ``F`` forward, ``B`` full backward, ``I`` backward for the stage's inputs
only, ``W`` backward for its weights (the rest of B), ``OVERLAP_F_B`` an F and a B run
together. Communication actions (``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``) move an
activation or a gradient between ranks; ``REDUCE_GRAD`` ends a stage's backward passes
of a step (its gradients get scaled there); ``UNSHARD``/``RESHARD`` are FSDP's and do
nothing here.
"""
import csv
import enum
import itertools
import re
from typing import NamedTuple

__all__ = ["_ComputationType", "_Action", "_format_pipeline_order", "F", "I", "W", "B",
           "FORWARD", "BACKWARD_INPUT", "BACKWARD_WEIGHT", "FULL_BACKWARD", "UNSHARD",
           "RESHARD", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OVERLAP_F_B", "REDUCE_GRAD",
           "parse_actions", "read_actions_csv", "write_actions_csv", "leaves"]


class _ComputationType(str, enum.Enum):
    FORWARD = "F"
    BACKWARD_INPUT = "I"
    BACKWARD_WEIGHT = "W"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    FULL_BACKWARD = "B"
    OVERLAP_F_B = "OVERLAP_F_B"
    REDUCE_GRAD = "REDUCE_GRAD"

    def __str__(self):
        return self.value

    @staticmethod
    def from_str(action):
        try:
            return _ComputationType(action)
        except ValueError:
            raise RuntimeError(f"Invalid computation type {action}") from None


FORWARD = F = _ComputationType.FORWARD
BACKWARD_INPUT = I = _ComputationType.BACKWARD_INPUT  # noqa: E741 - PyTorch's name
BACKWARD_WEIGHT = W = _ComputationType.BACKWARD_WEIGHT
FULL_BACKWARD = B = _ComputationType.FULL_BACKWARD
UNSHARD = _ComputationType.UNSHARD
RESHARD = _ComputationType.RESHARD
SEND_F = _ComputationType.SEND_F
RECV_F = _ComputationType.RECV_F
SEND_B = _ComputationType.SEND_B
RECV_B = _ComputationType.RECV_B
OVERLAP_F_B = _ComputationType.OVERLAP_F_B
REDUCE_GRAD = _ComputationType.REDUCE_GRAD

_COMPUTE = (F, B, I, W, OVERLAP_F_B)
_PATTERN = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)"
                      r"(\d*)$")


class _Action(NamedTuple):
    stage_index: int
    computation_type: _ComputationType
    microbatch_index: int = None
    sub_actions: tuple = None

    def __repr__(self):
        if self.sub_actions is not None:
            return f"({';'.join(map(repr, self.sub_actions))}){self.computation_type.value}"
        mb = "" if self.microbatch_index is None else str(self.microbatch_index)
        return f"{self.stage_index}{self.computation_type.value}{mb}"

    __str__ = __repr__

    @property
    def is_compute_op(self):
        return self.computation_type in _COMPUTE

    @staticmethod
    def from_str(action_string):
        """Parse ``repr``'s format; "" is None (an idle slot)."""
        text = action_string.strip()
        if not text:
            return None
        if text.startswith("(") and ")" in text:
            end = text.index(")")
            subs = tuple(a for a in (_Action.from_str(s) for s in text[1:end].split(";"))
                         if a is not None)
            return _Action(-1, _ComputationType.from_str(text[end + 1:]), None, subs or None)
        m = _PATTERN.match(text)
        if m is None:
            raise RuntimeError(f"Invalid action string: {action_string}, should be formatted "
                               "as [stage][action type][(microbatch)] e.g. 2F0")
        stage, kind, mb = m.groups()
        return _Action(int(stage), _ComputationType.from_str(kind), int(mb) if mb else None)


def leaves(action):
    """The action itself, or its sub-actions (OVERLAP_F_B)."""
    return action.sub_actions if action.sub_actions is not None else (action,)


def _format_pipeline_order(pipeline_order, error_step_number=None):
    """A grid of time steps (rows) by ranks (columns), as text; ``error_step_number`` marks
    the row a failure happened at."""
    ranks = sorted(pipeline_order)
    columns = [["" if a is None else str(a) for a in pipeline_order[r]] for r in ranks]
    steps = max((len(c) for c in columns), default=0)
    labels = ["Step " + str(i).zfill(len(str(steps - 1))) for i in range(steps)]
    rows = list(itertools.zip_longest(*columns, fillvalue=""))
    heads = [f"Rank {r}" for r in range(len(ranks))]
    widths = [max([len(heads[i])] + [len(row[i]) for row in rows]) for i in range(len(ranks))]
    pad = " " * (len(labels[0]) + 2) if labels else "  "
    lines = [pad + " ".join(h.ljust(w) for h, w in zip(heads, widths))]
    for i, (label, row) in enumerate(zip(labels, rows)):
        mark = " <-- ERROR HERE" if error_step_number == i else ""
        lines.append(f"{label}: " + " ".join(a.ljust(w) for a, w in zip(row, widths)) + mark)
    return "\n".join(lines) + "\n"


def parse_actions(text):
    """{rank: [actions]} from CSV text, one rank per line: ``"0F0,0F1,0B0,0B1"``."""
    rows = csv.reader(line for line in text.splitlines() if line.strip())
    return {rank: [_Action.from_str(s) for s in row] for rank, row in enumerate(rows)}


def read_actions_csv(filename):
    """{rank: [actions]} from a CSV file, one rank per row."""
    with open(filename, newline="") as fh:
        return parse_actions(fh.read())


def write_actions_csv(filename, pipeline_order):
    with open(filename, "w", newline="") as fh:
        writer = csv.writer(fh)
        for rank in sorted(pipeline_order):
            writer.writerow(["" if a is None else str(a) for a in pipeline_order[rank]])
