"""From the ranks' compute actions to what each rank runs: checks, gradient reductions,
FSDP's (here idle) unshard/reshard, and the sends and receives between ranks, placed as
``torch.distributed.pipelining`` places them (so a schedule's IR and its CSV dump are
PyTorch's); and a dry run that finds deadlocks and counts time steps.
"""
import collections

from .actions import (B, F, I, OVERLAP_F_B, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B,
                      SEND_F, UNSHARD, W, _Action, _format_pipeline_order, leaves)

__all__ = ["_add_reduce_grad", "_add_unshard_reshard", "_merge_bw", "_add_send_recv",
           "_defer_recv_ops", "_validate_schedule", "_simulate_comms_compute"]


def _add_reduce_grad(actions, n_microbatches):
    """Drop idle slots; after a stage's last B or W of the step, add its REDUCE_GRAD."""
    out, count = [], collections.Counter()
    for a in actions:
        if a is None:
            continue
        out.append(a)
        done = []
        for leaf in leaves(a):
            if leaf.computation_type in (B, W):
                count[leaf.stage_index] += 1
                if count[leaf.stage_index] == n_microbatches:
                    done.append(leaf.stage_index)
        out.extend(_Action(s, REDUCE_GRAD, None) for s in done)
    return out


def _next_stages(count, actions):
    """The next ``count`` distinct stages the actions compute on (a whole OVERLAP_F_B
    counts even past ``count``, as PyTorch counts it)."""
    seen = []
    for a in actions:
        if a is None:
            continue
        if a.computation_type == OVERLAP_F_B and a.sub_actions is not None:
            seen += [s.stage_index for s in a.sub_actions if s.stage_index not in seen]
            if len(seen) >= count:
                break
        elif a.stage_index not in seen:
            seen.append(a.stage_index)
            if len(seen) == count:
                break
    return seen


def _add_unshard_reshard(compute_actions, max_active_stages=3):
    """UNSHARD a stage before it computes, RESHARD it when it leaves the next
    ``max_active_stages`` stages to compute (FSDP's all-gathers; no-ops here)."""
    active, out = set(), []
    for i, a in enumerate(compute_actions):
        if a is None:
            continue
        upcoming = _next_stages(max_active_stages, compute_actions[i:])
        for s in sorted(active - set(upcoming)):
            active.discard(s)
            out.append(_Action(s, RESHARD, None))
        for s in upcoming:
            if s not in active:
                active.add(s)
                out.append(_Action(s, UNSHARD, None))
        out.append(a)
    out.extend(_Action(s, RESHARD, None) for s in sorted(active))
    return out


def _merge_bw(compute_actions):
    """Adjacent I and W of one stage and micro-batch become one B."""
    actions = [a for a in compute_actions if a is not None]
    out, i = [], 0
    while i < len(actions):
        a = actions[i]
        nxt = actions[i + 1] if i + 1 < len(actions) else None
        if a.computation_type == I and nxt is not None and nxt.computation_type == W and \
                (a.stage_index, a.microbatch_index) == (nxt.stage_index, nxt.microbatch_index):
            out.append(_Action(a.stage_index, B, a.microbatch_index))
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def _add_send_recv(compute_actions, stage_to_rank, num_stages):
    """Each rank's actions with a SEND after every F or B/I whose neighbour stage is on
    another rank, and the matching RECV in that rank's list once the send is placed
    (no rank places its own receives, so sends and receives never cross)."""
    pending = {r: list(a) for r, a in compute_actions.items()}
    out = {r: [] for r in compute_actions}
    done = {r: set() for r in compute_actions}

    def comms(a):
        s, kind = a.stage_index, a.computation_type
        if kind == F and s != num_stages - 1 and stage_to_rank(s + 1) != stage_to_rank(s):
            return _Action(s, SEND_F, a.microbatch_index), _Action(s + 1, RECV_F,
                                                                   a.microbatch_index)
        if kind in (I, B) and s != 0 and stage_to_rank(s - 1) != stage_to_rank(s):
            return _Action(s, SEND_B, a.microbatch_index), _Action(s - 1, RECV_B,
                                                                   a.microbatch_index)
        return None

    def ready(a, prev):
        s, kind, mb = a.stage_index, a.computation_type, a.microbatch_index
        if kind == F and s != 0:
            return _Action(s, RECV_F, mb) in prev or _Action(s - 1, F, mb) in prev
        if kind in (I, B) and s != num_stages - 1:
            return any(x in prev for x in (_Action(s, RECV_B, mb), _Action(s + 1, I, mb),
                                           _Action(s + 1, B, mb)))
        return True

    while pending:
        progress = False
        for rank in sorted(pending):
            if not pending[rank]:
                raise AssertionError(f"rank={rank}, len(compute_actions[rank])=0")
            a = pending[rank][0]
            subs = leaves(a) if a is not None else (None,)
            if a is not None and not all(ready(x, done[rank]) for x in subs):
                continue
            if a is not None:
                out[rank].append(a)
                for x in subs:
                    done[rank].add(x)
                    pair = comms(x)
                    if pair is not None:
                        send, recv = pair
                        out[rank].append(send)
                        done[rank].add(send)
                        peer = stage_to_rank(recv.stage_index)
                        out[peer].append(recv)
                        done[peer].add(recv)
            pending[rank].pop(0)
            if not pending[rank]:
                del pending[rank]
            progress = True
        if not progress:
            raise AssertionError("Malformed compute schedule, can't schedule sends/recvs")
    return out


def _defer_recv_ops(actions, stage_to_rank):
    """Each RECV moved as late as it can go: just before the compute that needs it, or
    before a SEND to the same peer from a lower rank (which receives first)."""
    def recv_peer(a):
        return stage_to_rank(a.stage_index - 1 if a.computation_type == RECV_F
                             else a.stage_index + 1)

    def send_peer(a):
        return stage_to_rank(a.stage_index + 1 if a.computation_type == SEND_F
                             else a.stage_index - 1)
    result = {}
    for rank, items in actions.items():
        out, waiting = [], {}
        for a in items:
            kind = a.computation_type
            if kind in (RECV_F, RECV_B):
                waiting[(a.stage_index, kind, a.microbatch_index)] = a
                continue
            if kind in (SEND_F, SEND_B) and rank < send_peer(a):
                for key in [k for k, v in waiting.items() if recv_peer(v) == send_peer(a)]:
                    out.append(waiting.pop(key))
            for sub in leaves(a):
                want = RECV_F if sub.computation_type == F else (
                    RECV_B if sub.computation_type in (B, I) else None)
                key = (sub.stage_index, want, sub.microbatch_index)
                if want is not None and key in waiting:
                    out.append(waiting.pop(key))
            out.append(a)
        if waiting:
            raise AssertionError(f"Malformed input schedule on rank {rank}: leftover RECV ops "
                                 f"with no consumer found: {list(waiting.values())}. Every "
                                 "RECV must be consumed by a downstream compute op.")
        result[rank] = out
    return result


def _validate_schedule(actions, pp_group_size, num_stages, num_microbatches):
    """Check a compute schedule (every stage: each micro-batch forward once, backward once
    as B or as I then W, after its forward) and return its stage -> rank mapping."""
    if len(actions) != pp_group_size:
        raise AssertionError(f"Schedule has incorrect number of ranks - expected "
                             f"{pp_group_size}, actual {len(actions)}")
    for rank in range(pp_group_size):
        if rank not in actions:
            raise AssertionError(f"Schedule is missing actions for rank {rank}")
    seen = {s: {F: set(), B: set(), I: set(), W: set()} for s in range(num_stages)}
    mapping = {}
    needs = {B: (F, "Full Backward", "Forward"), I: (F, "Backward Input", "Forward"),
             W: (I, "Backward Weight", "Backward Input")}

    def fail(rank, step, text):
        raise AssertionError(f"Rank {rank}, step {step}: {text}\n\nFull pipeline schedule:\n"
                             f"{_format_pipeline_order(actions, error_step_number=step)}")
    for rank in actions:
        for step, a in enumerate(actions[rank]):
            if a is None:
                continue
            if not isinstance(a, _Action):
                raise AssertionError(f"Rank {rank}, step {step}: Got an invalid action: {a}, "
                                     "expected instance of _Action")
            for x in leaves(a):
                s, kind, mb = x.stage_index, x.computation_type, x.microbatch_index
                if s not in seen:
                    fail(rank, step, f"stage {s} does not exist (the schedule has "
                                     f"{num_stages} stages)")
                if kind in needs:
                    before, name, before_name = needs[kind]
                    if mb not in seen[s][before]:
                        fail(rank, step, f"Running {name} for stage {s}, microbatch {mb} "
                                         f"without first running {before_name}")
                if kind in seen[s]:
                    seen[s][kind].add(mb)
                if mapping.setdefault(s, rank) != rank:
                    fail(rank, step, f"Stage {s} is assigned to both rank {rank} and rank "
                                     f"{mapping[s]}")
    for s, kinds in seen.items():
        f, b, i, w = (len(kinds[k]) for k in (F, B, I, W))
        if f != num_microbatches:
            raise AssertionError(f"Got {f} {F} microbatches for stage {s}, expected "
                                 f"{num_microbatches}")
        if i != w:
            raise AssertionError(f"Invalid backward microbatches for stage {s}: I and W must "
                                 f"have equal counts, but got I={i}, W={w}")
        if b + (i + w) // 2 != num_microbatches:
            raise AssertionError(f"Invalid backward microbatches for stage {s}: expected "
                                 f"{num_microbatches} total backwards, but got B={b}, I={i}, "
                                 f"W={w}")
    return mapping


def _simulate_comms_compute(pipeline_order, stage_to_rank, num_stages):
    """Run the ranks' lists in lock step, one action per rank per time step when its
    inputs are there; idle slots where not. Raises ValueError on a deadlock; returns the
    timeline (its length is a schedule's time steps)."""
    pending = {r: [a for a in pipeline_order[r] if a is not None] for r in sorted(pipeline_order)}
    timeline = {r: [] for r in pending}
    done = {r: set() for r in pending}

    def ready(a):
        if a.sub_actions is not None:
            return all(ready(x) for x in a.sub_actions)
        s, kind, mb = a.stage_index, a.computation_type, a.microbatch_index
        prev = done[stage_to_rank(s)]
        if kind == F:
            return s == 0 or _Action(s, RECV_F, mb) in prev or _Action(s - 1, F, mb) in prev
        if kind in (I, B):
            return s == num_stages - 1 or any(x in prev for x in (
                _Action(s, RECV_B, mb), _Action(s + 1, I, mb), _Action(s + 1, B, mb)))
        if kind == SEND_F:
            return _Action(s, F, mb) in prev
        if kind == RECV_F:
            return _Action(s - 1, SEND_F, mb) in done[stage_to_rank(s - 1)]
        if kind == SEND_B:
            return _Action(s, I, mb) in prev or _Action(s, B, mb) in prev
        if kind == RECV_B:
            return _Action(s + 1, SEND_B, mb) in done[stage_to_rank(s + 1)]
        if kind in (W, UNSHARD, RESHARD, REDUCE_GRAD):  # local: nothing to wait for
            return True
        raise ValueError(f"Unsupported action type {a}")

    def run(rank):
        a = pending[rank].pop(0)
        done[rank].update((a,) + tuple(a.sub_actions or ()))
        return a
    while pending:
        progress = False
        for rank in sorted(pending):
            if pending[rank] and ready(pending[rank][0]):
                timeline[rank].append(run(rank))
                progress = True
            elif pending[rank]:
                timeline[rank].append(None)
        pending = {r: a for r, a in pending.items() if a}
        # a slot left idle above may have been unblocked by a later rank in this step
        for rank in sorted(pending):
            if timeline[rank][-1] is None and ready(pending[rank][0]):
                timeline[rank][-1] = run(rank)
        pending = {r: a for r, a in pending.items() if a}
        if not progress:
            raise ValueError("Schedule is not progressing:\n"
                             + _format_pipeline_order(timeline))
    return timeline
