"""The README's tour runs as written, and its test command is the one CI runs first, in a
virtual environment without PyTorch, before it installs PyTorch and runs the suite again."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks(lang):
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_tour_runs():
    tour = _blocks("python")[0]
    code = compile(tour, "README.md tour", "exec")
    namespace = {}
    exec(code, namespace)  # noqa: S102 - our own documentation, not input


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second_before_torch():
    install_and_run, install_and_test = (b.strip() for b in _blocks("bash")[:2])
    assert install_and_run.endswith("distgrad launch configs/quickstart.toml")
    assert "pytest" in install_and_test
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert install_and_test in ci            # the README's line, verbatim
    first = ci.index(install_and_test)
    assert ci[first - 1] == "rm -rf .venv"   # in a new environment
    assert not any("torch" in line for line in ci[:first + 1])    # without PyTorch
    assert ci[first + 1].startswith("test $? -eq 0")   # a failure there ends CI
    then = ci[first + 2:]
    assert any("pip install" in line and "'torch==2.13.0'" in line and "pytest" in line
               for line in then)             # and then the comparisons against it
