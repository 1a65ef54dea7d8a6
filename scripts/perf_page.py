"""docs/performance.md is written by the benchmarks: each owns one section of it.

A benchmark script runs its ``main`` inside :func:`recorded`; run with ``--record`` it
prints as always, and when the run ends with its JSON line, its section of the page is
replaced by this run's table, the command, the date and the machine (cores and CPU
model, never a host name). Without ``--record`` nothing is written, so smoke tests and
runs on a laptop leave the page alone::

    if __name__ == "__main__":
        with perf_page.recorded("bench_engine"):
            sys.exit(main())

``python scripts/bench_engine.py --record`` then updates the page; commit it with the
change it measures.
"""
import contextlib
import datetime
import io
import json
import os
import platform
import re
import sys
from pathlib import Path

__all__ = ["recorded", "write_section", "machine"]

PAGE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
FLAG = "--record"
HEADER = """# Performance

Written by the benchmark scripts (`python scripts/bench_<name>.py --record` replaces its
own section; `scripts/perf_page.py` says how). Each table compares candidates measured in
the same run, interleaved, medians of repetitions: read the ratios, not the absolute
times, and compare runs only on one machine on one day. Every benchmark prints the same
table on your machine without `--record`.
"""


def machine():
    """The machine a table was measured on, without naming it: cores, CPU, OS, versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = [f"Python {platform.python_version()}"]
    for name in ("numpy", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            versions.append(f"{'NumPy' if name == 'numpy' else 'PyTorch'} "
                            f"{module.__version__}")
    return f"{cores} cores, {cpu}, {platform.system()} {platform.machine()}; {', '.join(versions)}"


def _markers(name):
    return f"<!-- {name}: start -->", f"<!-- {name}: end -->"


def write_section(name, body, page=None):
    """Replace ``name``'s section of ``page`` (docs/performance.md) with ``body``
    (markdown), adding it at the end when the page has none; the other sections stay."""
    page = page or PAGE
    start, end = _markers(name)
    text = page.read_text() if page.exists() else HEADER
    section = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)


def _section(name, command, output):
    table = "\n".join(line for line in output.rstrip().splitlines()[:-1])  # the JSON line off
    date = datetime.date.today().isoformat()
    return (f"## {name}\n\n`{command}`, {date}, on {machine()}.\n\n"
            f"```text\n{table.strip()}\n```")


class _Tee(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.captured = stream, io.StringIO()

    def write(self, text):
        self.captured.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


@contextlib.contextmanager
def recorded(name):
    """Run a benchmark's ``main`` inside: with ``--record`` among its arguments (taken out
    before ``main`` parses them), its output becomes ``name``'s section of the page once
    the run ends well with its JSON line."""
    record = FLAG in sys.argv[1:]
    if not record:
        yield
        return
    sys.argv = [a for a in sys.argv if a != FLAG]
    command = " ".join(["python", f"scripts/{Path(sys.argv[0]).name}"] + sys.argv[1:])
    tee = _Tee(sys.stdout)
    try:
        with contextlib.redirect_stdout(tee):
            yield
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
        _write_if_complete(name, command, tee.captured.getvalue())
        raise
    _write_if_complete(name, command, tee.captured.getvalue())


def _write_if_complete(name, command, output):
    lines = output.rstrip().splitlines()
    try:
        json.loads(lines[-1])
    except (IndexError, ValueError):
        print(f"perf_page: {name} printed no JSON line last; {PAGE.name} is unchanged",
              file=sys.stderr)
        return
    write_section(name, _section(name, command, output))
    print(f"perf_page: wrote the {name} section of docs/{PAGE.name}", file=sys.stderr)
