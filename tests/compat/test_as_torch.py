"""``python -m distgrad.compat.as_torch``: ``import torch`` is distgrad, in the program and
in every Python process it starts; real torch stays untouched elsewhere."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distgrad.compat import as_torch

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path, env=None, timeout=90):
    env = dict(os.environ if env is None else env)
    env.pop(as_torch.ENV_FLAG, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    return subprocess.run([sys.executable] + args, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_program_and_its_spawned_children_import_distgrad_as_torch(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch.nn as nn
        from torch.distributed import rpc
        import torch.multiprocessing as mp

        def child(i, names):
            import torch.utils.data
            names.put((i, torch.__name__, torch.utils.data.__name__))

        if __name__ == "__main__":
            assert torch.nn is nn and nn.__name__ == "distgrad.nn"
            print("main", torch.__name__, rpc.__name__, sys.argv[1:])
            ctx = mp.get_context("spawn")
            names = ctx.Queue()
            mp.spawn(child, args=(names,), nprocs=2)
            print(sorted(names.get(timeout=30) for _ in range(2)))
            import subprocess
            out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__name__)"],
                                 capture_output=True, text=True, check=True).stdout
            print("subprocess", out.strip())
    """))
    done = _run(["-m", "distgrad.compat.as_torch", str(program), "--flag", "x"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "main distgrad distgrad.distributed.rpc ['--flag', 'x']"
    assert lines[1] == str([(i, "distgrad", "distgrad.utils.data") for i in range(2)])
    assert lines[2] == "subprocess distgrad"


def test_modules_run_with_dash_m_and_missing_submodules_name_distgrad(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(textwrap.dedent("""
        import torch
        print(torch.tensor([1.0, 2.0]).sum().item())
        try:
            import torch.no_such_module
        except ModuleNotFoundError as e:
            print(e)
    """))
    done = _run(["-m", "distgrad.compat.as_torch", "-m", "mypkg.train"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["3.0", "No module named 'distgrad.no_such_module'"]


def test_usage_errors(tmp_path):
    assert _run(["-m", "distgrad.compat.as_torch"], tmp_path).returncode == 2
    missing = _run(["-m", "distgrad.compat.as_torch", "nope.py"], tmp_path)
    assert missing.returncode == 2 and "nope.py" in missing.stderr
    usage = _run(["-m", "distgrad.compat.as_torch", "--help"], tmp_path)
    assert usage.returncode == 0 and usage.stdout.startswith("usage:")


def test_a_shadowed_sitecustomize_still_runs_and_the_flag_gates_the_alias(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins\nbuiltins.OTHER_SITE = True\n")
    env = as_torch.child_environment({**os.environ, "PYTHONPATH": str(other)})
    probe = ("import builtins, sys; from distgrad.compat import as_torch; "
             "print(getattr(builtins, 'OTHER_SITE', False), 'torch' in sys.modules, "
             "as_torch.installed())")
    on = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                        timeout=60)
    assert on.stdout.split() == ["True", "False", "True"], on.stderr  # nothing imported eagerly
    env[as_torch.ENV_FLAG] = "0"
    off = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         timeout=60)
    assert off.stdout.split() == ["True", "False", "False"], off.stderr


def test_install_refuses_when_real_torch_is_already_imported(monkeypatch):
    import types
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    with pytest.raises(RuntimeError, match="already imported"):
        as_torch.install()
    assert not as_torch.installed()


def test_child_environment_never_puts_site_packages_ahead_of_the_standard_library(monkeypatch):
    import distgrad
    checkout = str(Path(distgrad.__file__).resolve().parents[1])
    env = as_torch.child_environment({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [as_torch.SITE_DIR, checkout, "/elsewhere"]
    assert env[as_torch.ENV_FLAG] == "1"
    monkeypatch.setattr(as_torch, "_site_packages", lambda: {checkout})  # as if installed
    assert as_torch.child_environment({})["PYTHONPATH"] == as_torch.SITE_DIR


def test_reprs_name_torch_as_pytorch_prints_them(tmp_path):
    program = tmp_path / "reprs.py"
    program.write_text(textwrap.dedent("""
        import torch
        t = torch.ones(2, 3, dtype=torch.float64)
        print(str(t.dtype), repr(t.shape), t.type(), str(torch.sparse_coo))
    """))
    out = _run(["-m", "distgrad.compat.as_torch", str(program)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["torch.float64", "torch.Size([2,", "3])", "torch.DoubleTensor",
                                  "torch.sparse_coo"]
    torch = pytest.importorskip("torch")
    t = torch.ones(2, 3, dtype=torch.float64)  # the same line on PyTorch
    assert out.stdout.strip() == " ".join([str(t.dtype), repr(t.shape), t.type(),
                                           str(torch.sparse_coo)])
