"""The collective algorithms, as programs the communicator runs (see ``programs.py``).

A program is a generator function of ``prog`` (its context: ``prog.rank`` and
``prog.size`` in the group, ``prog.send(peer, step, payload)``, and
``x = yield prog.recv(peer, step)``). Buffers are flat, contiguous NumPy arrays
that the program reads and writes in place; received arrays are read-only views
(over the message, or over a shared-memory segment).

Small messages take one round: every rank sends to every rank that needs its
data, so the latency is one message (for the few ranks of one machine this beats
a tree's log n rounds); more than ``DIRECT_MAX_RANKS`` ranks take recursive doubling
for a small all-reduce (log2 n rounds of one message per rank), and recursive halving
and doubling for one up to ``HALVING_MAX_BYTES`` (2 log2 n rounds, the ring's bytes).
Large ones take a ring, split into pieces that move on as soon as they are reduced
(a pipeline), so each rank sends and receives ``2 (n-1)/n`` of the data in an
all-reduce. Two ranks exchange whole tensors up to a few MB: the same bytes as their
ring (``2 (n-1)/n`` is 1), in one round instead of two. Every reduction combines
contributions in an order fixed by the ranks alone, so every rank gets the same bits
and a rerun gets them again.

``NATURAL`` algorithms send to their right neighbour before they wait for
anything and cannot end without a message from their left neighbour; for the
others the program runner adds that exchange (it is how mismatched collectives
are noticed, see ``programs.py``).
"""
import numpy as np

from .reduce_op import combine, finish

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather",
           "scatter", "all_to_all", "barrier", "SMALL_BYTES", "PIECE_BYTES"]

#: Below this many bytes (per rank) a collective takes one round of direct messages.
SMALL_BYTES = 64 << 10
#: Ring pieces: large enough that a message's fixed cost is small, small enough to pipeline.
PIECE_BYTES = 8 << 20
#: Two ranks exchange whole tensors up to this size (one round; the ring takes two).
TWO_RANKS_DIRECT = 4 << 20
#: Small all-reduces of more ranks than this take recursive doubling (log2 n rounds, one
#: message per rank and round) instead of one round of n - 1 messages per rank.
DIRECT_MAX_RANKS = 8
#: All-reduces of more than DIRECT_MAX_RANKS ranks up to this size take recursive halving
#: and doubling: the ring's bytes per rank in 2 log2 n rounds instead of its 2 (n - 1)
#: (a 256 KB all-reduce of 64 ranks on 2 cores: 8.5 s by the ring, its 126 steps each
#: waiting for every process to be scheduled).
HALVING_MAX_BYTES = 4 << 20


def _bounds(numel, n):
    """Boundaries of ``n`` nearly equal chunks of ``numel`` elements."""
    return [numel * i // n for i in range(n + 1)]


def _pieces(lo, hi, per):
    """[lo, hi) split into pieces of at most ``per`` elements (one, maybe empty, at least)."""
    if hi - lo <= per:
        return [(lo, hi)]
    return [(a, min(a + per, hi)) for a in range(lo, hi, per)]


def _one_round(nbytes, n):
    """Whether one round of direct messages beats the ring: small data, or a lone rank
    (the ring needs a neighbour)."""
    return nbytes <= SMALL_BYTES or n == 1


def reduce_in_place(prog, own, step, op):
    """``own`` becomes the reduction of the same piece of every rank (the others sent it
    at ``step``), combined in rank order. In place: only a rank from 2 on needs a
    temporary, for the ranks before it."""
    acc = None
    for p in range(prog.size):
        x = own if p == prog.rank else (yield prog.recv(p, step))
        if acc is None:
            acc = x
        elif acc is own or p == prog.rank:
            acc = combine(op, acc, x, out=own)
        elif acc.flags.writeable:  # the temporary
            combine(op, acc, x, out=acc)
        else:  # a received (read-only) piece so far
            acc = combine(op, acc, x)
    finish(op, own, prog.size)


# ---------------------------------------------------------------------- the ring
def ring(prog, flat, bounds, op=None, reduce=True, gather=True):
    """Ring over chunks ``flat[bounds[c]:bounds[c+1]]``: with ``reduce``, a reduce-scatter
    after which rank ``r`` holds chunk ``r`` reduced (with ``op``); with ``gather``, an
    all-gather of chunk ``r`` from each rank ``r``. Pieces move on as soon as they are
    ready."""
    r, n = prog.rank, prog.size
    right, left = (r + 1) % n, (r - 1) % n
    per = max(1, PIECE_BYTES // max(flat.itemsize, 1))
    pieces = [_pieces(bounds[c], bounds[c + 1], per) for c in range(n)]
    stride = max(len(p) for p in pieces)  # steps of one ring step: step * stride + piece

    def view(c, k):
        a, b = pieces[c][k]
        return flat[a:b]

    if reduce:
        first = (r - 1) % n
        for k in range(len(pieces[first])):
            prog.send(right, k, view(first, k))
        for s in range(n - 1):
            c = (r - s - 2) % n
            for k in range(len(pieces[c])):
                x = yield prog.recv(left, s * stride + k)
                v = view(c, k)
                combine(op, v, x, out=v)
                x = None  # the last view of the sender's segment: it can lend it again
                if s < n - 2:
                    prog.send(right, (s + 1) * stride + k, v)
                else:  # chunk r is complete
                    finish(op, v, n)
                    if gather:
                        prog.send(right, (n - 1) * stride + k, v)
    elif gather:
        for k in range(len(pieces[r])):
            prog.send(right, (n - 1) * stride + k, view(r, k))
    if gather:
        for s in range(n - 1):
            c = (r - s - 1) % n
            for k in range(len(pieces[c])):
                x = yield prog.recv(left, (n - 1 + s) * stride + k)
                v = view(c, k)
                v[...] = x
                x = None
                if s < n - 2:
                    prog.send(right, (n + s) * stride + k, v)


# ---------------------------------------------------------------------- collectives
def all_reduce(flat, op, n):
    """(program, natural) reducing ``flat`` in place on every rank."""
    def direct(prog):
        # every rank sends its whole tensor (in pieces) to every other and reduces them all
        # in rank order: one round, n - 1 copies of the data per rank
        r, n = prog.rank, prog.size
        pieces = _pieces(0, flat.size, max(1, PIECE_BYTES // max(flat.itemsize, 1)))
        for k, (a, b) in enumerate(pieces):
            for p in range(n):
                if p != r:
                    prog.send(p, k, flat[a:b])
        for k, (a, b) in enumerate(pieces):
            yield from reduce_in_place(prog, flat[a:b], k, op)

    def pipelined(prog):
        yield from ring(prog, flat, _bounds(flat.size, prog.size), op)

    if n > DIRECT_MAX_RANKS and flat.nbytes <= SMALL_BYTES:
        return (lambda prog: doubling(prog, flat, op)), False
    if n > DIRECT_MAX_RANKS and flat.nbytes <= HALVING_MAX_BYTES:
        return (lambda prog: halving_doubling(prog, flat, op)), False
    return (direct if _one_round(flat.nbytes, n) or (n == 2 and flat.nbytes <= TWO_RANKS_DIRECT)
            else pipelined), True


_FOLDED_RESULT = 1 << 40  # the step of the result sent back to a folded rank


def _folded(prog, flat, op, rounds):
    """Run ``rounds(m)``, the program of the ranks below the largest power of two ``m``,
    with the ranks beyond it folded in: rank ``r >= m`` hands its tensor to rank ``r - m``
    first and gets the result back at the end."""
    r, n = prog.rank, prog.size
    m = 1 << (n.bit_length() - 1)
    if r >= m:
        prog.send(r - m, 0, flat)
        flat[...] = yield prog.recv(r - m, _FOLDED_RESULT)
        return
    if r + m < n:
        combine(op, flat, (yield prog.recv(r + m, 0)), out=flat)
    yield from rounds(m)
    if r + m < n:
        prog.send(r + m, _FOLDED_RESULT, flat)


def _add_partial(op, own, theirs, theirs_first):
    """``own`` combined with a partner's partial result, the lower-ranked one first, so
    both partners compute the same bits."""
    if theirs_first:
        combine(op, theirs, own, out=own)
    else:
        combine(op, own, theirs, out=own)


def doubling(prog, flat, op):
    """Recursive doubling: the ranks beyond the largest power of two ``m`` fold in
    (:func:`_folded`); then in round ``i`` every rank ``r < m`` exchanges its partial result
    with rank ``r ^ 2**i``, the lower-ranked partial first."""
    def rounds(m):
        r = prog.rank
        mask, step = 1, 1
        while mask < m:
            partner = r ^ mask
            prog.send(partner, step, flat)
            _add_partial(op, flat, (yield prog.recv(partner, step)), partner < r)
            mask <<= 1
            step += 1
        finish(op, flat, prog.size)
    return _folded(prog, flat, op, rounds)


def halving_doubling(prog, flat, op):
    """Recursive halving, then doubling (Rabenseifner's all-reduce). The ranks beyond the
    largest power of two ``m`` fold in first (:func:`_folded`). ``flat`` is cut into ``m``
    chunks. Halving: in round ``i`` every rank ``r < m`` keeps half of the chunks it still
    reduces (the lower half if bit ``m >> i`` of ``r`` is 0), sends the other half to rank
    ``r ^ (m >> i)`` and adds what that rank sent for its own half, the lower-ranked
    partial first; rank ``r`` ends up with chunk ``r`` reduced. Doubling: in round ``i`` it
    swaps the chunks it holds with rank ``r ^ 2**i``. Each chunk is reduced by one rank
    only, so every rank gets the same bits."""
    def rounds(m):
        r = prog.rank
        bounds = _bounds(flat.size, m)

        def chunks(lo, hi):
            return flat[bounds[lo]:bounds[hi]]

        lo, hi, step = 0, m, 1
        mask = m >> 1
        while mask:
            mid = (lo + hi) // 2
            partner = r ^ mask
            keep, give = ((lo, mid), (mid, hi)) if r & mask == 0 else ((mid, hi), (lo, mid))
            prog.send(partner, step, chunks(*give))
            x = yield prog.recv(partner, step)
            _add_partial(op, chunks(*keep), x, partner < r)
            x = None  # the last view of the sender's segment: it can lend it again
            lo, hi = keep
            mask >>= 1
            step += 1
        finish(op, chunks(r, r + 1), prog.size)
        mask = 1
        while mask < m:
            partner = r ^ mask
            prog.send(partner, step, chunks(lo, hi))
            x = yield prog.recv(partner, step)
            width = hi - lo
            plo = lo + width if r & mask == 0 else lo - width
            chunks(plo, plo + width)[...] = x
            x = None
            lo, hi = min(lo, plo), max(hi, plo + width)
            mask <<= 1
            step += 1
    return _folded(prog, flat, op, rounds)


def reduce_scatter(work, block, op, out, n):
    """Reduce ``work`` (``n`` blocks of ``block`` elements, one per rank) and leave block
    ``r`` in ``out`` on rank ``r``. ``work`` may be overwritten."""
    def direct(prog):
        r, n = prog.rank, prog.size
        for p in range(n):
            if p != r:
                prog.send(p, 0, work[p * block:(p + 1) * block])
        mine = work[r * block:(r + 1) * block]
        yield from reduce_in_place(prog, mine, 0, op)
        out[...] = mine

    def pipelined(prog):
        n = prog.size
        yield from ring(prog, work, [p * block for p in range(n + 1)], op, gather=False)
        out[...] = work[prog.rank * block:(prog.rank + 1) * block]

    return (direct if _one_round(block * work.itemsize, n) else pipelined), True


def all_gather(work, block, n):
    """Fill ``work`` (``n`` blocks of ``block`` elements) on every rank, block ``r`` coming
    from rank ``r`` (which has it in place already)."""
    def direct(prog):
        r, n = prog.rank, prog.size
        mine = work[r * block:(r + 1) * block]
        for p in range(n):
            if p != r:
                prog.send(p, 0, mine)
        for p in range(n):
            if p != r:
                work[p * block:(p + 1) * block] = yield prog.recv(p, 0)

    def pipelined(prog):
        yield from ring(prog, work, [p * block for p in range(prog.size + 1)], reduce=False)

    return (direct if _one_round(block * work.itemsize, n) else pipelined), True


def broadcast(flat, root, n):
    """``flat`` of ``root`` into ``flat`` everywhere: directly, or down a pipelined chain
    (root, root+1, ...) for large tensors."""
    def direct(prog):
        if prog.rank == root:
            for p in range(prog.size):
                if p != root:
                    prog.send(p, 0, flat)
        else:
            flat[...] = yield prog.recv(root, 0)

    def chain(prog):
        r, n = prog.rank, prog.size
        right, left = (r + 1) % n, (r - 1) % n
        pieces = _pieces(0, flat.size, max(1, PIECE_BYTES // max(flat.itemsize, 1)))
        for k, (a, b) in enumerate(pieces):
            if r != root:
                flat[a:b] = yield prog.recv(left, k)
            if right != root:
                prog.send(right, k, flat[a:b])

    return (direct if _one_round(flat.nbytes, n) or n == 2 else chain), False


def reduce(flat, op, root, n):
    """Reduce ``flat`` of every rank into ``flat`` of ``root`` (others keep theirs)."""
    def direct(prog):
        if prog.rank != root:
            prog.send(root, 0, flat)
            return
        yield from reduce_in_place(prog, flat, 0, op)

    def pipelined(prog):
        r, n = prog.rank, prog.size
        work = np.array(flat, copy=True)
        bounds = _bounds(flat.size, n)
        yield from ring(prog, work, bounds, op, gather=False)
        if r != root:
            prog.send(root, 1 << 40, work[bounds[r]:bounds[r + 1]])
            return
        flat[bounds[r]:bounds[r + 1]] = work[bounds[r]:bounds[r + 1]]
        for p in range(n):
            if p != r:
                flat[bounds[p]:bounds[p + 1]] = yield prog.recv(p, 1 << 40)

    return (direct if _one_round(flat.nbytes, n) else pipelined), False


def gather(mine, outs, root):
    """``mine`` of every rank into ``outs[rank]`` on ``root`` (``outs`` is None elsewhere);
    payloads may be any codec value (the ``*_object`` collectives)."""
    def program(prog):
        if prog.rank != root:
            prog.send(root, 0, mine)
            return
        for p in range(prog.size):
            outs[p] = mine if p == root else (yield prog.recv(p, 0))

    return program, False


def scatter(ins, root, deliver):
    """``ins[p]`` of ``root`` to rank ``p``: ``deliver(value)`` runs with this rank's."""
    def program(prog):
        if prog.rank == root:
            for p in range(prog.size):
                if p != root:
                    prog.send(p, 0, ins[p])
            deliver(ins[root])
        else:
            deliver((yield prog.recv(root, 0)))

    return program, False


def all_to_all(ins, deliver):
    """``ins[p]`` to rank ``p`` from every rank: ``deliver(p, value)`` with what came from
    ``p`` (own value included)."""
    def program(prog):
        r, n = prog.rank, prog.size
        for p in range(n):
            if p != r:
                prog.send(p, 0, ins[p])
        deliver(r, ins[r])
        for p in range(n):
            if p != r:
                deliver(p, (yield prog.recv(p, 0)))

    return program, True


def barrier():
    def program(prog):
        r, n = prog.rank, prog.size
        for p in range(n):
            if p != r:
                prog.send(p, 0, None)
        for p in range(n):
            if p != r:
                yield prog.recv(p, 0)

    return program, True
