"""Where a key of a launch config is written: its line in the TOML file (``tomllib`` keeps
no positions) or the command-line override it came from, for messages that point at it.
"""
import re

__all__ = ["key_lines", "Where"]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-\" ]+?)\s*\]\]?\s*(#.*)?$")
_ASSIGN = re.compile(r"^\s*([A-Za-z0-9_\-\"]+(?:\s*\.\s*[A-Za-z0-9_\-\"]+)*)\s*=")


def key_lines(text):
    """{dotted key: line number} of headers and assignments; array tables as ``hooks.0``.

    A light scan, not a parser: it is only used to point at a line in messages and
    falls back to the enclosing table when a key is written inside an inline table.
    """
    lines, prefix, counts = {}, "", {}
    in_multiline = None
    for number, line in enumerate(text.splitlines(), 1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        m = _HEADER.match(line)
        if m:
            name = _dotted(m.group(2))
            if m.group(1) == "[[":
                index = counts[name] = counts.get(name, -1) + 1
                name = f"{name}.{index}"
            prefix = name
            lines.setdefault(prefix, number)
            continue
        m = _ASSIGN.match(line)
        if m:
            key = f"{prefix}.{_dotted(m.group(1))}" if prefix else _dotted(m.group(1))
            lines.setdefault(key, number)
            rest = line[m.end():]
            for quote in ('"""', "'''"):
                if rest.count(quote) == 1:
                    in_multiline = quote
    return lines


def _dotted(name):
    return ".".join(p.strip().strip('"') for p in name.split("."))


class Where:
    """Finds the source (file or override) and line of a dotted key for messages."""

    def __init__(self, path, text):
        self.path = path
        self.lines = key_lines(text) if text is not None else {}
        self.overrides = {}

    def __call__(self, key):
        if key in self.overrides:
            return f"command line override {self.overrides[key]!r}", None
        if key not in self.lines:  # a table the file lacks, brought in by an override
            under = next((text for dotted, text in self.overrides.items()
                          if dotted.startswith(key + ".")), None)
            if under is not None:
                return f"command line override {under!r}", None
        probe = key
        while probe:
            if probe in self.lines:
                return self.path, self.lines[probe]
            probe = probe.rpartition(".")[0]
        return self.path, None
