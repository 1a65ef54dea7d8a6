"""``rpc.shutdown`` as PyTorch's: the same program (``tests/support/late_calls.py``) on both.
While the main thread shuts down, another thread's new calls are still answered; the calls
made before are answered; a call after the shutdown fails."""
import importlib.util
import json
import os
import pathlib
import sys

import pytest

from distgrad.utils.ports import free_port
from support.sessions import run_in_session

pytestmark = pytest.mark.timeout(120)

PROGRAM = pathlib.Path(__file__).resolve().parents[1] / "support" / "late_calls.py"
EXPECTED = {"earlier": [0, 1, 2], "calls_started_during_shutdown_answered": True,
            "a_call_after_it_fails": True}


@pytest.mark.parametrize("library", ["distgrad", "torch"])
def test_other_threads_call_while_the_main_thread_shuts_down(library):
    if library == "torch" and importlib.util.find_spec("torch") is None:
        pytest.skip("PyTorch is not installed: nothing to compare with")
    code, out, err = run_in_session([sys.executable, str(PROGRAM), library, str(free_port())],
                                    dict(os.environ), PROGRAM.parent, timeout=100)
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == EXPECTED
