"""The documentation runs as written: every docstring example of the package (doctest) and
every example script. The blocks of README.md and docs/ run in test_doc_pages.py."""
import doctest
import importlib
import os
import pathlib
import subprocess
import sys

import pytest

from distgrad.utils.ports import free_port

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distgrad"
OPTIONAL = {"matplotlib", "tqdm", "torch", "tensorboard"}  # extras a module may need


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("__init__",):
            parts.pop()
        if parts[-1] == "__main__":
            continue
        yield ".".join(parts)


@pytest.mark.parametrize("name", list(_modules()))
def test_docstring_examples_run(name):
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if e.name in OPTIONAL:
            pytest.skip(f"{name} needs the optional {e.name}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):  # examples see their module's names, as doctest does
        if test.filename and not str(test.filename).startswith(str(PACKAGE)):
            continue  # re-exported objects are checked where they are defined
        runner.run(test)
    failed, tried = runner.summarize(verbose=False)
    assert failed == 0, f"{failed} of {tried} docstring examples in {name} failed"


def _run(path, cwd, timeout=90):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    p = subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert p.returncode == 0, f"{path.name} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("example_*.py")))
def test_example_scripts_run(script, tmp_path):
    _run(ROOT / "scripts" / script, tmp_path)


def test_no_docstring_example_is_skipped():
    """An example that needs a world points to a complete program instead (see above)."""
    skipped = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
               if "doctest: +SKIP" in p.read_text()]
    assert skipped == []
