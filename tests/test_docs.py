"""The documentation runs as written: every docstring example of the package (doctest),
every example script, and every Python block of README.md (each as a script of its own,
as a reader would save and run it)."""
import doctest
import importlib
import os
import pathlib
import re
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


def _readme_blocks():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(_readme_blocks())))
def test_readme_python_blocks_run_as_written(index, tmp_path):
    """A block is a script, or a test file when its first line names one (``# test_x.py``),
    which then runs under pytest with distgrad's plugin, as a user's suite would."""
    block = _readme_blocks()[index]
    first = block.splitlines()[0]
    test_file = re.match(r"# (test_\w+\.py)", first)
    if test_file is None:
        path = tmp_path / f"readme_block_{index}.py"
        path.write_text(block)
        _run(path, tmp_path)
        return
    (tmp_path / test_file.group(1)).write_text(block)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        test_file.group(1)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]


def test_readme_links_stay_inside_the_repository():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r"`(\.\./[^`]*)`", text)
    outside = [t for t in links if t.startswith(("../", "/"))]
    assert not outside, f"README points outside the repository: {outside}"


def test_no_docstring_example_is_skipped():
    """An example that needs a world points to a complete program instead (see above)."""
    skipped = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
               if "doctest: +SKIP" in p.read_text()]
    assert skipped == []
