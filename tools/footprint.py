#!/usr/bin/env python3
"""`python tools/footprint.py ...` in a checkout: the same as `colibri footprint ...` once installed (colibri/footprint.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.footprint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
