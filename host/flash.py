#!/usr/bin/env python3
"""`python host/flash.py ...` in a checkout: the same as `colibri run ...` once installed (colibri/flash.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.console import run_tool  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_tool("colibri.flash", None, "flash.py"))
