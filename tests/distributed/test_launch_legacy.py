"""``python -m torch.distributed.launch`` (the legacy launcher) as a layer over our torchrun:
``--local-rank`` passed as PyTorch passes it unless ``--use-env``, its deprecation warning;
and ``@record`` writing a worker's exception where the launcher reports it."""
import json
import sys
import textwrap

import pytest

from support.sessions import run_in_session
from test_run import _env

pytestmark = pytest.mark.timeout(240)

_ARGS_PROBE = textwrap.dedent("""
    import json, os, sys
    sys.stdout.write("ARGS " + json.dumps([os.environ["LOCAL_RANK"], sys.argv[1:]]) + "\\n")
""")

_RECORDED = textwrap.dedent("""
    import os
    from {torch}.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            raise ValueError("rank one gave up")

    if __name__ == "__main__":
        main()
""")


def _launch(args, tmp_path, as_torch=False):
    return run_in_session(args, _env(tmp_path, as_torch), tmp_path, 150)


def _reports(out):
    return sorted(json.loads(line[5:]) for line in out.splitlines() if line.startswith("ARGS "))


@pytest.mark.parametrize("launcher", [["-m", "distgrad.distributed.launch"],
                                      ["-m", "distgrad.compat.as_torch", "-m",
                                       "torch.distributed.launch"]])
def test_workers_get_local_rank_as_an_argument_unless_use_env(tmp_path, launcher):
    script = tmp_path / "probe.py"
    script.write_text(_ARGS_PROBE)
    base = [sys.executable] + launcher + ["--standalone", "--nproc-per-node", "2"]
    code, out, err = _launch(base + [str(script), "--lr", "0.1"], tmp_path,
                             as_torch="as_torch" in launcher[1])
    assert code == 0, err
    assert _reports(out) == [["0", ["--local-rank=0", "--lr", "0.1"]],
                             ["1", ["--local-rank=1", "--lr", "0.1"]]]
    assert "FutureWarning: The module torch.distributed.launch is deprecated" in err
    code, out, err = _launch(base + ["--use-env", str(script), "--lr", "0.1"], tmp_path)
    assert code == 0, err
    assert _reports(out) == [["0", ["--lr", "0.1"]], ["1", ["--lr", "0.1"]]]


def test_no_python_needs_use_env(tmp_path):
    code, _, err = _launch([sys.executable, "-m", "distgrad.distributed.launch",
                            "--no-python", "true"], tmp_path)
    assert code != 0
    assert "When using the '--no-python' flag, you must also set the '--use-env' flag." in err


@pytest.mark.parametrize("torch", ["distgrad", "torch"])
def test_record_writes_the_error_file_and_the_launcher_reports_it(tmp_path, torch):
    script = tmp_path / "recorded.py"
    script.write_text(_RECORDED.format(torch=torch))
    launcher = [sys.executable] + (["-m", "distgrad.compat.as_torch"] if torch == "torch"
                                   else []) + ["-m", "distgrad.distributed.run"]
    code, _, err = _launch(launcher + ["--standalone", "--nproc-per-node", "2", str(script)],
                           tmp_path, as_torch=torch == "torch")
    assert code == 1
    report = err[err.index("Root Cause"):]
    assert "rank      : 1 (local_rank: 1)" in report and "error.json" in report
    assert 'raise ValueError("rank one gave up")' in report
    assert "ValueError: rank one gave up" in report
    assert "To enable traceback" not in report
