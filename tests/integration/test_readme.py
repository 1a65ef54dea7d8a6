"""The README's tour runs as written, and its test command is the one CI runs."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks(lang):
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_tour_runs():
    tour = _blocks("python")[0]
    exec(compile(tour, "README.md tour", "exec"), {})  # noqa: S102 - our own documentation


def test_readme_opens_with_the_two_commands():
    install_and_run, install_and_test = _blocks("bash")[:2]
    assert "scripts/train_mlp.py" in install_and_run
    assert "pytest" in install_and_test
    assert "awk" in (ROOT / ".ci" / "run").read_text()  # CI extracts and runs this very line
