"""One rank of a world that runs PyTorch's dist_autograd tests, one test at a time.

    python runner.py RANK PORT                                  # on PyTorch
    python -m distgrad.compat.as_torch runner.py RANK PORT      # on distgrad

The rank connects to the test process at 127.0.0.1:PORT and says hello; then each line
it receives, ``{"test": "Class.test_name", "file_name": path}``, runs that test as
PyTorch's ``MultiProcessTestCase`` runs it in a rank's process (an instance with
``rank`` and ``file_name`` set, the method called; its ``dist_init`` joins and leaves
the RPC world), and the answer is a line ``{"rank", "outcome", "detail", "spent"}``
(outcome ``passed``, ``failed`` or ``skipped``). Before every test but the first, the
test module is reloaded, so its globals (``rpc_done``, ``ctx_ids``, ...) start fresh as
in a new process (the module is PyTorch's own file, read from the installed torch:
``torch_cases.py``). A test that does not shut down cleanly spends the world: the rank
answers and exits, and the test process starts a new world. When the connection
closes (the test process ended the world, or died) the rank exits at once, whatever it
is doing. SIGUSR1 prints every thread's stack to stderr (the test process asks for it
when a rank does not answer in time).
"""
import faulthandler
import importlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
import unittest

import torch_cases


def _watch(conn, commands, cond):
    """Read command lines into ``commands``; exit the process when the connection ends."""
    reader = conn.makefile("rb")
    for line in reader:
        with cond:
            commands.append(json.loads(line))
            cond.notify()
    os._exit(0)


def _run(cases, rank, command):
    cls_name, method = command["test"].split(".")
    test = getattr(cases, cls_name)(method)
    test.rank = rank
    test.file_name = command["file_name"]
    spent = not getattr(getattr(type(test), method), "clean_shutdown", True)
    try:
        getattr(test, method)()
    except unittest.SkipTest as e:
        return "skipped", str(e), spent
    except SystemExit as e:  # test_clean_context_during_backward ends its process
        return ("passed" if e.code in (0, None) else "failed"), f"exit {e.code}", True
    except BaseException:  # noqa: BLE001 - the test process shows the traceback
        return "failed", traceback.format_exc(), True
    return "passed", "", spent


def main():
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    conn = socket.create_connection(("127.0.0.1", port), timeout=60)
    conn.settimeout(None)
    commands, cond = [], threading.Condition()
    threading.Thread(target=_watch, args=(conn, commands, cond), daemon=True,
                     name="runner-commands").start()

    def answer(**fields):
        conn.sendall(json.dumps(dict(fields, rank=rank)).encode() + b"\n")

    answer(hello=os.getpid())
    torch_cases.install()  # dist_autograd_cases: the installed PyTorch's test file
    cases = None
    while True:
        with cond:
            cond.wait_for(lambda: commands)
            command = commands.pop(0)
        cases = importlib.import_module("dist_autograd_cases") if cases is None \
            else importlib.reload(cases)
        outcome, detail, spent = _run(cases, rank, command)
        sys.stdout.flush()
        sys.stderr.flush()
        answer(outcome=outcome, detail=detail, spent=spent)
        if spent:
            os._exit(0)  # whatever the test left running (threads, sockets) goes with us


if __name__ == "__main__":
    main()
