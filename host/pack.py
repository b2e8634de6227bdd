#!/usr/bin/env python3
"""`python host/pack.py ...` in a checkout: the same as `colibri pack ...` once installed (colibri/pack.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.console import guarded  # noqa: E402
from colibri.pack import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(guarded(main, None, "pack.py"))
