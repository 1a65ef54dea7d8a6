"""An activation store process (a thin script; the entry point is ``python -m distgrad store``)."""
import sys

from distgrad.offload.store.command import main

if __name__ == "__main__":
    sys.exit(main())
