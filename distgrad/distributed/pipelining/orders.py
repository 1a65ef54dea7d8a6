"""The order of each schedule: which compute actions a rank runs, one list per rank.

The schedule classes (``schedules.py``) and ``distgrad launch``'s pipeline strategy both
take their orders from here, so there is one definition of each schedule. The orders
are PyTorch's, action for action (``None`` is an idle slot, kept where PyTorch keeps one:
it shows the bubble in the formatted order and in ``_simulate_comms_compute``).

>>> [str(a) for a in one_f_one_b(0, 2, 3)]
['0F0', '0F1', '0B0', '0F2', '0B1', '0B2', '0REDUCE_GRAD']

Every backward of a stage runs in micro-batch order except in Looped BFS (reverse).
"""
import collections

from .actions import B, F, I, OVERLAP_F_B, W, _Action
from .lowering import _add_reduce_grad
from ._utils import generate_rank_to_stage_mapping

__all__ = ["gpipe", "one_f_one_b", "forward_only", "looped_bfs", "interleaved_1f1b",
           "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipe_v", "rounds_of"]


def gpipe(rank, pp_size, n_mb):
    """All forwards, then all backwards (GPipe's fill and drain)."""
    actions = [None] * rank + [_Action(rank, F, i) for i in range(n_mb)]
    actions += [None] * (3 * (pp_size - 1 - rank)) + [_Action(rank, B, i) for i in range(n_mb)]
    return _add_reduce_grad(actions, n_mb)


def one_f_one_b(rank, pp_size, n_mb):
    """``pp_size - rank`` forwards, then one backward and one forward in turn."""
    warmup = min(pp_size - 1 - rank, n_mb)  # (PyTorch's class refuses n_mb < pp_size)
    actions = [None] * rank + [_Action(rank, F, i) for i in range(warmup)]
    actions += [None] * max(0, 2 * (pp_size - 1 - rank))
    backward = 0
    for fwd in range(warmup, n_mb):
        actions += [_Action(rank, F, fwd), _Action(rank, B, backward)]
        backward += 1
    for b in range(backward, n_mb):
        actions += [None, _Action(rank, B, b)]
    return _add_reduce_grad(actions, n_mb)


def forward_only(rank, pp_size, n_mb):
    return [_Action(rank, F, i) for i in range(n_mb)]


def looped_bfs(rank, pp_size, n_local, n_mb):
    """Breadth first: every micro-batch through a local stage before the next stage."""
    stages = range(rank, pp_size * n_local, pp_size)
    actions = [None] * rank
    for s in stages:
        actions += [_Action(s, F, i) for i in range(n_mb)]
    actions += [None] * (2 * (pp_size - 1 - rank))
    for s in reversed(stages):
        actions += [_Action(s, B, i) for i in reversed(range(n_mb))]
    return actions


def rounds_of(n_mb, pp_size, name):
    """(rounds, micro-batches per round) of the interleaved schedules; ValueError unless
    the micro-batches divide into rounds of about ``pp_size``."""
    rounds = max(1, n_mb // pp_size)
    if n_mb % rounds:
        raise ValueError(f"{name} requires the number of microbatches to be a multiple of the "
                         f"number of rounds ({rounds}), but got {n_mb}.")
    return rounds, n_mb // rounds


def _warmup(rank, n_local, per_round, pp_size, n_mb, factor):
    return min((n_local - 1) * per_round + factor * (pp_size - 1 - rank), n_mb * n_local)


def _interleaved(rank, pp_size, n_local, n_mb, zero_bubble):
    _, per_round = rounds_of(n_mb, pp_size, "Zero bubble" if zero_bubble else
                             "Interleaved 1F1B")
    warmup = _warmup(rank, n_local, per_round, pp_size, n_mb, 1 if zero_bubble else 2)
    total_mb_ops = n_local * n_mb
    steady = total_mb_ops - warmup

    def fwd_stage(step):
        return (step // per_round) % n_local * pp_size + rank

    def bwd_stage(step):
        return (n_local - 1 - (step - warmup) // per_round % n_local) * pp_size + rank
    counters = collections.defaultdict(int)

    def next_action(stage, kind):
        mb = counters[(stage, kind)]
        counters[(stage, kind)] += 1
        return _Action(stage, kind, mb)
    back = I if zero_bubble else B
    actions = [None] * rank
    idle = pp_size - rank - 1 if zero_bubble else \
        n_local * pp_size + 2 * (pp_size - 1 - rank) - (warmup + rank)
    backward_steps, weights_done = [], 0
    first_weight = rank if zero_bubble else None  # ZB: the first `rank` backwards keep W
    for op in range(warmup + steady + warmup):
        if op < warmup:
            actions.append(next_action(fwd_stage(op), F))
            if op == warmup - 1:
                actions += [None] * idle
            continue
        if op < warmup + steady:
            actions.append(next_action(fwd_stage(op), F))
        elif not zero_bubble:
            actions.append(None)
        actions.append(next_action(bwd_stage(op), back))
        backward_steps.append(op)
        if zero_bubble and op - warmup >= first_weight:
            actions.append(next_action(bwd_stage(backward_steps[weights_done]), W))
            weights_done += 1
    while zero_bubble and weights_done < len(backward_steps):
        actions.append(next_action(bwd_stage(backward_steps[weights_done]), W))
        weights_done += 1
    return actions


def interleaved_1f1b(rank, pp_size, n_local, n_mb):
    """Interleaved 1F1B (Narayanan et al. 2021): depth first over several local stages."""
    return _interleaved(rank, pp_size, n_local, n_mb, zero_bubble=False)


def interleaved_zero_bubble(pp_size, n_local, n_mb):
    """ZB1P (Qi et al. 2023) for every rank: interleaved, backward split into I and W,
    the W passes filling the bubbles; idle slots added where a forward's input is not
    there yet."""
    orders = {r: _interleaved(r, pp_size, n_local, n_mb, zero_bubble=True)
              for r in range(pp_size)}
    return _add_bubbles(orders, pp_size * n_local)


def _add_bubbles(orders, num_stages):
    seen, out = set(), {r: [] for r in orders}
    pointer = {r: 0 for r in orders}
    while True:
        stop, new = True, set()
        for rank in sorted(orders):
            t = pointer[rank]
            if t >= len(orders[rank]):
                continue
            stop = False
            a = orders[rank][t]
            if a is None:
                pointer[rank] += 1
                out[rank].append(None)
                continue
            s, kind, mb, _ = a
            waiting = kind == F and s != 0 and (s - 1, F, mb) not in seen
            if kind == B:
                waiting = (s, F, mb) not in seen if s == num_stages - 1 else \
                    (s + 1, B, mb) not in seen
            if waiting:
                out[rank].append(None)
            else:
                out[rank].append(a)
                if mb is not None:
                    new.add((s, kind, mb))
                pointer[rank] += 1
        seen |= new
        if stop:
            return out


def zbv_zero_bubble(rank, pp_size, num_stages, n_mb):
    """ZB-V (Qi et al. 2023, section 6): two stages per rank in a V, I and W split."""
    n = max(2 * pp_size - 1, n_mb)
    down, up = rank, num_stages - 1 - rank
    count = collections.Counter()
    actions = [None] * rank

    def add(*steps):  # (stage, kind) pairs, each the stage's next micro-batch of its kind
        for stage, kind in steps:
            actions.append(_Action(stage, kind, count[(stage, kind)]))
            count[(stage, kind)] += 1
    add(*[(down, F)] * (2 * (pp_size - rank) - 1))
    add(*[(up, F), (down, F)] * rank)
    add(*[(up, F), (up, I), (up, W)] * (pp_size - rank))
    while count[(up, F)] < count[(down, F)] or count[(down, F)] < n:
        if count[(down, F)] < n:
            add((down, F))
        add((down, I), (down, W), (up, F), (up, I), (up, W))
    add(*[(down, I), (up, I)] * rank)
    add(*[(down, I), (down, W)] * (pp_size - rank))
    add(*[(up, W)] * (count[(up, I)] - count[(up, W)]))
    add(*[(down, W)] * (count[(down, I)] - count[(down, W)]))
    for s in (down, up):
        if not count[(s, W)] == count[(s, I)] == count[(s, F)]:
            raise AssertionError(f"stage {s}: {count[(s, F)]} F, {count[(s, I)]} I, "
                                 f"{count[(s, W)]} W")
    return [a if a is not None and a.microbatch_index < n_mb else None for a in actions]


def dualpipe_v(rank, pp_size, n_mb):
    """DualPipeV (DeepSeek 2024, its V variant): forwards of one stage overlapped with
    backwards of the other, W passes queued and run where there is room."""
    down, up = generate_rank_to_stage_mapping(pp_size, pp_size * 2, style="v")[rank]
    count = collections.Counter()
    weights = collections.deque()
    actions = []

    def take(stage, kind):
        mb = count[(stage, kind)]
        count[(stage, kind)] += 1
        return mb

    def add(stage, kind):
        if kind == B:  # a full backward advances both halves' counters
            mb = take(stage, I)
            count[(stage, W)] += 1
        else:
            mb = take(stage, kind)
            if kind == I:
                weights.append((stage, mb))
        actions.append(_Action(stage, kind, mb))

    def overlap(fwd_stage, bwd_stage):
        f = _Action(fwd_stage, F, take(fwd_stage, F))
        b = _Action(bwd_stage, B, take(bwd_stage, I))
        count[(bwd_stage, W)] += 1
        actions.append(_Action(-1, OVERLAP_F_B, None, (f, b)))

    def pending_weight():
        if weights:
            stage, mb = weights.popleft()
            actions.append(_Action(stage, W, mb))
            count[(stage, W)] += 1
    for _ in range((pp_size - rank - 1) * 2):
        add(down, F)
    for _ in range(rank + 1):
        add(down, F)
        add(up, F)
    for _ in range(pp_size - rank - 1):
        add(up, I)
        pending_weight()
        add(up, F)
    for i in range(n_mb - pp_size * 2 + rank + 1):
        if i == 0 and rank == pp_size - 1:  # not overlapped: a smaller bubble
            add(down, F)
            add(up, B)
        else:
            overlap(down, up)
        overlap(up, down)
    for _ in range(pp_size - rank - 1):
        add(up, B)
        overlap(up, down)
    split = False
    last = rank + 1
    for i in range(last):
        if i == last // 2 and rank % 2 == 1:
            split = True
        add(up, I if split else B)
        if i == last // 2 and rank % 2 == 0:
            split = True
        add(down, I if split else B)
    for _ in range(pp_size - rank - 1):
        pending_weight()
        add(down, I if split else B)
    for _ in range(rank + 1):
        pending_weight()
    return actions
