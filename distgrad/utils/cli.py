"""What the ``distgrad`` subcommands share on their command lines.

>>> import argparse
>>> p = argparse.ArgumentParser(prog="demo")
>>> _ = p.add_argument("--help-keys", action=PrintAndExit, lines=lambda: ["a  the first"])
>>> try:
...     p.parse_args(["--help-keys"])
... except SystemExit:
...     pass
a  the first
"""
import argparse
import os

__all__ = ["PrintAndExit", "env", "in_range"]


def env(name, default=None):
    """The environment variable ``name``, or ``default`` when it is unset or empty (an
    option's fallback: ``--rank`` defaults to ``$RANK``)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def in_range(kind, low, high=None, name=None):
    """argparse type: a number of ``kind`` in [low, high] with a message naming the option."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: must be {bound}")
        return value
    parse.__name__ = name or kind.__name__
    return parse


class PrintAndExit(argparse.Action):
    """An option that prints ``lines()`` and exits, as ``--help`` does (``--help-config``):
    the required positionals are not asked for, and the lines are made only when given."""

    def __init__(self, option_strings, dest, lines, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.lines = lines

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(self.lines()))
        parser.exit()
