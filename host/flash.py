#!/usr/bin/env python3
"""`python host/flash.py ...` in a checkout: the same as `colibri run ...` once installed (colibri/flash.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.console import guarded  # noqa: E402
from colibri.flash import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(guarded(main, None, "flash.py"))
