"""``python -m distgrad COMMAND ...``: the ``distgrad`` console command."""
import sys

from distgrad.cli import main

sys.exit(main())
