"""README.md and every guide in docs/ run as written: each ```python and ```bash block is
executed, as a reader would paste it, from a directory that looks like the repository root.

The convention for blocks (also in docs/README.md, for whoever writes a guide):

- A block runs as it stands, in a fresh directory of its own that holds links to the
  checkout's top-level entries, so ``configs/quickstart.toml`` and ``scripts/...`` resolve
  while ``runs/`` and any file a block writes land in that directory (blocks run in
  parallel, and nothing is left in the checkout). ``python`` and ``distgrad`` are the
  interpreter and the command of the environment running the tests; ``MASTER_ADDR`` and
  ``MASTER_PORT`` name a free local port. A bash block runs under ``set -euo pipefail``.
- A python block whose first line names a test file (``# test_mylib.py``) is that file, run
  with pytest (distgrad's plugin included), as a user's suite would run it.
- An HTML comment on the line right before the fence gives a block what it needs
  (it does not show on a rendered page); several settings share one comment::

      <!-- docs-test: timeout=60 -->                  seconds for this block (default 30)
      <!-- docs-test: file=mylib.py -->               not run: written as mylib.py into the
                                                      directory of every later block of the
                                                      page (any fence: python, toml, ...)
      <!-- docs-test: needs=srun -->                  skipped unless these commands are on PATH
      <!-- docs-test: setup=NAME -->                  a named setup of SETUPS below
                                                      (simulated-hosts: a block that makes
                                                      hosts with `distgrad hosts up`)
      <!-- docs-test: skip="why it cannot run here" -->

Other fences (``text``, ``toml``, ``ini``, ``console``...) are shown, not run. Keep blocks
quick (seconds: a launch uses a small config, or ``run.steps=`` of a few dozen): the whole
of this file should take well under a minute on 2 cores.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distgrad.utils.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUN = ("python", "bash")
DEFAULT_TIMEOUT = 30
# Entries of the checkout a block's directory does not link: its own output goes there
NOT_LINKED = {".git", ".venv", "runs", "__pycache__", ".pytest_cache"}
_hosts_made = iter(range(1, 1 << 30))


def _simulated_hosts(directory, env):
    """A block that makes simulated hosts (``distgrad hosts up``): skipped where they
    cannot be made; its hosts get a name of their own, go when the block ends (a trap),
    and are swept later if this process is killed first (their owner)."""
    from distgrad.testing import hosts
    why = hosts.unavailable()
    if why is not None:
        pytest.skip(why)
    env["DISTGRAD_HOSTS_NAME"] = f"dgdoc{os.getpid()}x{next(_hosts_made)}"
    env["DISTGRAD_HOSTS_OWNER"] = str(os.getpid())
    wrapper = directory / "with_hosts.sh"
    wrapper.write_text('trap "distgrad hosts down >/dev/null 2>&1 || true" EXIT\n"$@"\n')
    return ["bash", str(wrapper)]


# Setups a block can name (``setup=NAME``): each prepares the block's directory and
# environment before it runs and may return a list of extra arguments to start it with.
SETUPS = {"simulated-hosts": _simulated_hosts}

_DIRECTIVE = re.compile(r"<!--\s*docs-test:(.*?)-->", re.S)
# A fence may be indented (inside a list item); its closing fence has the same indent
_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.S | re.M)


class Block:
    def __init__(self, page, line, lang, code, options):
        self.page, self.line, self.lang, self.code, self.options = page, line, lang, code, options

    @property
    def id(self):
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def _options(text):
    """``key=value`` pairs (shell quoting) of the directives in ``text``."""
    options = {}
    for directive in _DIRECTIVE.findall(text):
        for word in shlex.split(directive):
            key, _, value = word.partition("=")
            options[key] = value
    return options


def _blocks(page):
    text = page.read_text()
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n")
        last_line = before.rsplit("\n", 1)[-1]
        options = _options(last_line) if _DIRECTIVE.search(last_line) else {}
        unknown = set(options) - {"timeout", "file", "needs", "setup", "skip"}
        if unknown:
            raise ValueError(f"{page.name}: unknown docs-test setting(s) {sorted(unknown)}")
        line = text.count("\n", 0, match.start()) + 1
        indent, lang, code = match.groups()
        code = textwrap.dedent(code) if indent else code
        yield Block(page, line, lang, code, options)


def _all_blocks():
    return [b for page in PAGES for b in _blocks(page) if b.lang in RUN and "file" not in b.options]


def _prepare(block, directory):
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (directory / entry.name).symlink_to(entry)
    for earlier in _blocks(block.page):  # files the page defined before this block
        if earlier.line >= block.line:
            break
        if "file" in earlier.options:
            (directory / earlier.options["file"]).write_text(earlier.code)


def _environment():
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               MPLBACKEND="Agg", PATH=os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DISTGRAD_WORLD_SECRET"):
        env.pop(name, None)
    return env


def _command(block, directory):
    if block.lang == "bash":
        script = directory / "docs_block.sh"
        script.write_text(block.code)
        return ["bash", "-euo", "pipefail", script.name]
    test_file = re.match(r"# (test_\w+\.py)\s*$", block.code.splitlines()[0])
    if test_file is not None:
        (directory / test_file.group(1)).write_text(block.code)
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                "no:randomly", test_file.group(1)]
    (directory / "docs_block.py").write_text(block.code)
    return [sys.executable, "docs_block.py"]


BLOCKS = _all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs_as_written(block, tmp_path):
    options = block.options
    if "skip" in options:
        pytest.skip(options["skip"] or "the page says it does not run here")
    missing = [c for c in options.get("needs", "").split(",") if c and shutil.which(c) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on PATH")
    _prepare(block, tmp_path)
    env = _environment()
    command = _command(block, tmp_path)
    if "setup" in options:
        if options["setup"] not in SETUPS:
            pytest.fail(f"{block.id}: no setup named {options['setup']!r} in "
                        f"tests/test_doc_pages.py (known: {sorted(SETUPS)})")
        command = (SETUPS[options["setup"]](tmp_path, env) or []) + command
    timeout = float(options.get("timeout", DEFAULT_TIMEOUT))
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (f"{block.id} failed with status {proc.returncode}:\n"
                                  f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")


def test_settings_stand_on_blocks_that_use_them():
    """A block that is not run (a toml block, say) takes ``file=`` only: any other setting
    there would be silently ignored."""
    for page in PAGES:
        for block in _blocks(page):
            if block.lang not in RUN and set(block.options) - {"file"}:
                pytest.fail(f"{block.page.name}:{block.line}: docs-test settings on a "
                            f"```{block.lang} block, which is not run")


def test_links_stay_inside_the_repository_and_resolve():
    bad = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path.startswith("/") or not (page.parent / path).resolve().is_relative_to(ROOT):
                bad.append(f"{page.name}: {target} points outside the repository")
            elif not (page.parent / path).exists():
                bad.append(f"{page.name}: {target} does not exist")
    assert bad == []
