"""A worker process (a thin script; the entry point is ``python -m distgrad worker``)."""
import sys

from distgrad.worker import main

if __name__ == "__main__":
    sys.exit(main())
