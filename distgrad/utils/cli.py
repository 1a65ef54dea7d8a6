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

__all__ = ["PrintAndExit"]


class PrintAndExit(argparse.Action):
    """An option that prints ``lines()`` and exits, as ``--help`` does (``--help-config``):
    the required positionals are not asked for, and the lines are made only when given."""

    def __init__(self, option_strings, dest, lines, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.lines = lines

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(self.lines()))
        parser.exit()
