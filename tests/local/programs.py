"""Small Python programs run as processes of their own by a test, reaped whatever happens."""
import subprocess
import sys
import time


def run_programs(commands, timeout=90, stagger=0.0):
    """Run ``python -c program *args`` for each ``(program, *args)`` of ``commands``, the
    next ``stagger`` s after the previous; return ``[(returncode, stdout, stderr)]`` once
    all have ended. Every process is killed and reaped on the way out, also on failure."""
    procs = []
    try:
        for i, (program, *args) in enumerate(commands):
            if i and stagger:
                time.sleep(stagger)
            procs.append(subprocess.Popen([sys.executable, "-c", program, *map(str, args)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        deadline = time.monotonic() + timeout
        outs = [p.communicate(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
