"""Functions that spawned test processes run (children import them by name)."""
import os
import signal
import sys
import time


def write_rank(i, path):
    with open(os.path.join(path, f"rank-{i}"), "w") as fh:
        fh.write(str(os.getpid()))


def fail_on(i, bad, path, nprocs):
    """Process ``bad`` raises once all ``nprocs`` have recorded their pid; the others
    sleep until reaped."""
    with open(os.path.join(path, f"pid-{i}.tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(os.path.join(path, f"pid-{i}.tmp"), os.path.join(path, f"pid-{i}"))
    if i == bad:
        deadline = time.monotonic() + 30
        while (sum(n.startswith("pid-") and not n.endswith(".tmp") for n in os.listdir(path))
               < nprocs and time.monotonic() < deadline):
            time.sleep(0.01)
        raise ValueError(f"process {i} failed on purpose")
    time.sleep(60)


def exit_with(i, code):
    sys.exit(code)


def kill_self(i):
    os.kill(os.getpid(), signal.SIGKILL)


def sleep_forever(i, path):
    with open(os.path.join(path, f"pid-{i}"), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(60)


def parent_main(path, nprocs):
    """A parent process for the orphan tests: spawns sleeping children and joins them.

    Ctrl-C raises KeyboardInterrupt here, as in a program run from a terminal, also when
    the suite runs where SIGINT is ignored (a background job of a script, nohup): an
    ignored SIGINT is inherited, Python then installs no KeyboardInterrupt, and the
    interrupt test would wait out the children's 60 s sleep."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import distgrad.multiprocessing as mp
    mp.spawn(sleep_forever, args=(path,), nprocs=nprocs)


if __name__ == "__main__":
    parent_main(sys.argv[1], int(sys.argv[2]))
