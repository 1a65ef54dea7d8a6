"""``distgrad launch`` as a script, for a source checkout without ``pip install``:

    python scripts/launch.py configs/quickstart.toml [KEY=VALUE ...] [--resume] [--trace FILE]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from distgrad.launch.command import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    sys.exit(main())
