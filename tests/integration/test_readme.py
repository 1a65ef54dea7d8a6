"""The README's tour runs as written, and its test command is the one CI runs."""
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


def test_readme_opens_with_the_two_commands_and_ci_runs_the_second():
    install_and_run, install_and_test = (b.strip() for b in _blocks("bash")[:2])
    assert install_and_run.endswith("distgrad launch configs/quickstart.toml")
    assert "pytest" in install_and_test
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci_lines[-1] == install_and_test  # CI's last line is the README's test command
