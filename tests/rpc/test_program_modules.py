"""The program's own modules are callable by peers without being named (as a module beside
the script is under PyTorch), without reopening what the hardening closed; class methods
travel bound to their class."""
import os
import sys
import textwrap
import types
from pathlib import Path

import pytest

from distgrad.rpc.allowlist import Allowlist, program_module, ref_of
from distgrad.rpc.errors import RefusedCallError
from distgrad.utils.ports import free_port
from support.sessions import run_in_session

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def program(tmp_path, monkeypatch):
    """A fake running program: ``main.py`` in tmp_path is ``__main__``; ``mine.py`` beside
    it is imported, ``later.py`` is not, and a package installed in a venv inside the
    program's directory is imported too."""
    (tmp_path / "mine.py").write_text(textwrap.dedent("""
        import os
        def scale(x, k):
            return x * k
        class Ops:
            @classmethod
            def twice(cls, x):
                return (cls.__name__, x * 2)
        class MoreOps(Ops):
            pass
        from fractions import Fraction
        class MyFraction(Fraction):  # inherits class methods the program did not write
            pass
    """))
    (tmp_path / "later.py").write_text("import sys\nsys.modules['later_ran'] = True\n"
                                       "def f():\n    return 1\n")
    site_dir = tmp_path / ".venv" / "lib" / "python3" / "site-packages"
    site_dir.mkdir(parents=True)
    (site_dir / "installed_pkg.py").write_text("def g():\n    return 2\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(tmp_path / "main.py")
    main.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.syspath_prepend(str(site_dir))
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("mine", "installed_pkg", "later", "later_ran")
    for name in names:
        sys.modules.pop(name, None)
    __import__("mine")
    __import__("installed_pkg")
    yield tmp_path
    for name in names:
        sys.modules.pop(name, None)


def test_imported_modules_of_the_programs_directory_are_allowed(program):
    import mine
    allow = Allowlist([])
    assert program_module("mine") and allow.resolve("mine:scale") is mine.scale
    assert allow.class_allowed(mine.Ops)
    for ref in ("mine:os.system", "mine:os", "mine:scale.__globals__"):  # still no trampolines
        with pytest.raises(RefusedCallError):
            allow.resolve(ref)


def test_not_imported_installed_stdlib_and_distgrad_modules_are_not(program):
    allow = Allowlist([])
    for name, ref in (("later", "later:f"), ("installed_pkg", "installed_pkg:g"),
                      ("json", "json:dumps"), ("distgrad.serialization",
                                               "distgrad.serialization:save")):
        assert not program_module(name)
        with pytest.raises(RefusedCallError):
            allow.resolve(ref)
    assert "later_ran" not in sys.modules  # refusing imported nothing
    with pytest.raises(RefusedCallError, match="allowed once the program imports them"):
        allow.resolve("later:f")


def test_a_program_run_from_an_installed_location_owns_no_modules(program, monkeypatch):
    import json
    sys.modules["__main__"].__file__ = json.__file__  # say, pytest's own __main__
    assert not program_module("mine") and not program_module("json")


def test_python_dash_m_programs_own_their_top_packages_directory(program, monkeypatch):
    pkg = program / "pkg"
    pkg.mkdir()
    main = sys.modules["__main__"]
    main.__file__ = str(pkg / "main.py")
    main.__spec__ = types.SimpleNamespace(name="pkg.main")
    assert program_module("mine")


def test_class_methods_travel_bound_to_the_class_they_were_taken_from(program):
    import mine
    allow = Allowlist([])
    assert ref_of(mine.MoreOps.twice) == "mine:MoreOps.twice"
    assert allow.resolve("mine:MoreOps.twice")(1) == ("MoreOps", 2)
    assert allow.resolve(ref_of(mine.Ops.twice))(3) == ("Ops", 6)
    with pytest.raises(TypeError, match="bound methods"):
        ref_of(mine.MoreOps().__sizeof__)                 # bound to an instance: never
    with pytest.raises(RefusedCallError, match="defined by fractions.Fraction"):
        allow.resolve("mine:MyFraction.from_float")        # a class method of other code
    with pytest.raises(RefusedCallError):
        allow.resolve("mine:MoreOps.mro")                  # type's, not the program's


_HELPERS = textwrap.dedent("""
    class Ops:
        @staticmethod
        def add(a, b):
            return a + b

        @classmethod
        def name_and_twice(cls, x):
            return cls.__name__, x * 2


    class MoreOps(Ops):
        pass


    def scale(x, k):
        return x * k
""")

_MAIN = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp
    import helpers

    def run(rank, world_size):
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
        if rank == 0:
            t = torch.ones(2)
            print("RESULT", rpc.rpc_sync("w1", helpers.scale, args=(t, 3.0)).tolist(),
                  rpc.rpc_sync("w1", helpers.Ops.add, args=(t, t)).tolist(),
                  rpc.rpc_sync("w1", helpers.MoreOps.name_and_twice, args=(5,)), flush=True)
        rpc.shutdown()

    if __name__ == "__main__":
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        mp.spawn(run, args=(2,), nprocs=2)
""")


def test_an_rpc_program_calls_functions_of_its_own_module_as_on_pytorch(tmp_path):
    (tmp_path / "helpers.py").write_text(_HELPERS)
    (tmp_path / "main.py").write_text(_MAIN)
    runs = {"distgrad": [sys.executable, "-m", "distgrad.compat.as_torch", "main.py"]}
    if __import__("importlib").util.find_spec("torch"):
        runs["torch"] = [sys.executable, "main.py"]
    results = {}
    for name, argv in runs.items():
        env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_PORT=str(free_port()),
                   PYTHONWARNINGS="ignore")
        env.pop("DISTGRAD_AS_TORCH", None)
        code, out, err = run_in_session(argv, env, tmp_path)
        assert code == 0, (name, err[-3000:])
        results[name] = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert results["distgrad"] == ["RESULT [3.0, 3.0] [2.0, 2.0] ('MoreOps', 10)"]
    assert len({tuple(r) for r in results.values()}) == 1
