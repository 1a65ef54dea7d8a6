"""A chain of RPCs through every rank and one ``dist_autograd.backward`` back through
them: what a step of many small messages costs, distgrad beside PyTorch.

Rank 0 sends 16 floats (requiring grad) to rank 1 with ``rpc_sync``, which multiplies
them and passes them on, and so on to the last rank, whose result comes back along the
chain; rank 0 then runs ``dist_autograd.backward`` on its sum, which sends the gradient
back through every rank. Per world size and library:

* **first**: the first step, of ranks that have not talked to each other yet (rank 0 has
  called each once, as PyTorch's ``init_rpc`` does before it returns, so that every
  process is serving: the step does not wait for a slower process's start);
* **steady**: the median step once the chain's ranks are connected and have warmed up
  (``--warmup`` steps after the first, not measured: the 16-rank chain took about 10 of
  them to settle, from 66 to 50 ms, which a median of 20 steps did not hide) and, of it,
  the forward chain alone;
* **after a2a**: the median step after an all-to-all has connected every pair (a world
  where every rank talks to every other, as the issue that asked for this measured);
* **floor**: 2 (N - 1) round trips of raw pyzmq between two processes (the chain's
  messages, one after another, with nothing else done), measured in the same run.

    python scripts/bench_chain.py                   # 8 and 16 ranks, PyTorch when installed
    python scripts/bench_chain.py --sizes 4 --steps 5 --no-torch

Every process runs on this host's loopback with one BLAS thread. Prints a table and one
JSON line. Where a hop of the backward spends its time (receiving, processing, the
wire): ``backward_timeline.py``.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_world_scale import echo, library_modules, run_members  # noqa: E402

_FLOATS = 16


def member(rank, n, master, port, library, started, steps, warmup=10):
    """One process of the chain's world; rank 0 returns the step times (ms)."""
    torch, _, dist_autograd, rpc, step, options = library_modules(library)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR=master,
                      MASTER_PORT=str(port))
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=n, rpc_backend_options=options)
    out = {}
    if rank == 0:
        for p in range(1, n):  # everyone serves (PyTorch's init_rpc ends with such a round)
            rpc.rpc_sync(f"w{p}", echo, (p,))
        x = torch.ones(_FLOATS, requires_grad=True)

        forwards = []

        def one_step():
            t0 = time.perf_counter()
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("w1", step, (x, 1, n))
                forwards.append((time.perf_counter() - t0) * 1000)
                dist_autograd.backward(cid, [y.sum()])
                grad = dist_autograd.get_gradients(cid)[x]
            took = (time.perf_counter() - t0) * 1000
            assert abs(float(grad[0]) - 1.5 ** (n - 1)) < 1e-3 * 1.5 ** (n - 1)
            return took

        out["first"] = one_step()
        for _ in range(warmup):
            one_step()
        del forwards[:]
        out["steady"] = [one_step() for _ in range(steps)]
        out["steady_forward"] = list(forwards)
        for p in range(1, n):  # every pair connected: each rank calls all the others
            rpc.rpc_sync(f"w{p}", _all_to_all, (p, n, library))
        out["after_a2a"] = [one_step() for _ in range(steps)]
    rpc.shutdown()
    return out


def _all_to_all(rank, n, library):
    """Rank ``rank`` calls every other rank once."""
    if library == "torch":
        import torch.distributed.rpc as rpc
    else:
        import distgrad.distributed.rpc as rpc
    futs = [rpc.rpc_async(f"w{p}", echo, (rank,)) for p in range(n) if p != rank]
    return [f.wait() for f in futs]


def raw_round_trip_us(rounds=2000):
    """The median round trip (us) of 16 floats between two processes over raw pyzmq
    (tcp on loopback): the floor of one hop of the chain there and back."""
    import multiprocessing as mp

    import numpy as np
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    peer = mp.get_context("spawn").Process(target=_echo_peer, args=(port, rounds))
    peer.start()
    payload = np.ones(_FLOATS, dtype=np.float32).tobytes()
    times = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            sock.send(payload)
            sock.recv()
            times.append(time.perf_counter() - t0)
    finally:
        peer.join(30)
        sock.close(linger=0)
        ctx.term()
    return statistics.median(times[rounds // 10:]) * 1e6


def _echo_peer(port, rounds):
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(f"tcp://127.0.0.1:{port}")
    for _ in range(rounds):
        sock.send(sock.recv())
    sock.close(linger=0)
    ctx.term()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="8,16")
    p.add_argument("--steps", type=int, default=20, help="steps measured per phase")
    p.add_argument("--warmup", type=int, default=10,
                   help="steps after the first before the steady ones are measured")
    p.add_argument("--reps", type=int, default=3, help="worlds per size and library "
                   "(the table shows medians over them)")
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args()
    libraries = ["distgrad"]
    if not args.no_torch:
        try:
            import torch  # noqa: F401
            libraries.append("torch")
        except ImportError:
            pass
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rt = raw_round_trip_us()
    rows, port = [], 29700
    print(f"raw pyzmq round trip of {_FLOATS} floats: {rt:.0f} us")
    print(f"{'library':9} {'N':>3} {'first ms':>9} {'steady ms':>10} {'(forward)':>10} "
          f"{'after a2a ms':>13} {'floor ms':>9} {'steady/floor':>13} {'first/steady':>13}")
    for n in [int(s) for s in args.sizes.split(",") if s]:
        floor = 2 * (n - 1) * rt / 1000
        for library in libraries:
            runs = []
            for _ in range(args.reps):  # the libraries' worlds take turns, one at a time
                port += 1
                results, errors = run_members(n, None, library, port,
                                              target="bench_chain:member",
                                              extra=(args.steps, args.warmup))
                if errors:
                    raise SystemExit(f"{library} at {n} ranks failed: {errors[0][:500]}")
                runs.append(results[0])
            row = {"library": library, "n": n,
                   "first_ms": statistics.median(r["first"] for r in runs),
                   "steady_ms": statistics.median(statistics.median(r["steady"]) for r in runs),
                   "forward_ms": statistics.median(statistics.median(r["steady_forward"])
                                                   for r in runs),
                   "after_a2a_ms": statistics.median(statistics.median(r["after_a2a"])
                                                     for r in runs),
                   "floor_ms": floor}
            rows.append(row)
            print(f"{library:9} {n:>3} {row['first_ms']:9.1f} {row['steady_ms']:10.1f} "
                  f"{row['forward_ms']:10.1f} {row['after_a2a_ms']:13.1f} {floor:9.2f} "
                  f"{row['steady_ms'] / floor:13.1f} {row['first_ms'] / row['steady_ms']:13.2f}")
    print(json.dumps({"bench": "chain", "raw_round_trip_us": rt, "rows": rows}))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_chain"):  # with --record: docs/performance.md
        sys.exit(main())
