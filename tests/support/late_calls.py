"""A program run unchanged on PyTorch and on distgrad (``python late_calls.py torch|distgrad
PORT``): while rank 0's main thread shuts RPC down, another of its threads keeps calling
rank 1. Prints one JSON line: the earlier calls' values, whether calls the other thread
started during the shutdown were answered, and whether its first call after it failed."""
import json
import os
import sys
import threading
import time


def slow(seconds, value):
    time.sleep(seconds)
    return value


def add(a, b):
    return a + b


def run(rank, library, port):
    if library == "torch":
        import torch.distributed.rpc as rpc
    else:
        import distgrad.distributed.rpc as rpc
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
    if rank != 0:
        rpc.shutdown()
        return
    earlier = [rpc.rpc_async("w1", slow, (0.5, i)) for i in range(3)]
    calling, shutting_down = threading.Event(), threading.Event()
    started_and_answered, refused = [], []

    def keep_calling():
        while True:
            started_during = shutting_down.is_set()
            try:
                assert rpc.rpc_sync("w1", add, (1, 2)) == 3
            except Exception as e:  # noqa: BLE001 - RPC is shut down: what the program sees
                refused.append(type(e).__name__)
                return
            calling.set()
            if started_during:
                started_and_answered.append(1)
    caller = threading.Thread(target=keep_calling)
    caller.start()
    calling.wait(60)
    shutting_down.set()
    rpc.shutdown()  # returns once the earlier calls are answered and rank 1 is here too
    caller.join(30)
    print(json.dumps({"earlier": [f.wait() for f in earlier],
                      "calls_started_during_shutdown_answered": len(started_and_answered) > 0,
                      "a_call_after_it_fails": bool(refused) and not caller.is_alive()}), flush=True)


if __name__ == "__main__":
    import multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    library, port = sys.argv[1], int(sys.argv[2])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run, args=(r, library, port)) for r in (1, 0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    sys.exit(max(p.exitcode or 0 for p in procs))
