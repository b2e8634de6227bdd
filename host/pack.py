#!/usr/bin/env python3
"""`python host/pack.py ...` in a checkout: the same as `colibri pack ...` once installed (colibri/pack.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.console import run_tool  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_tool("colibri.pack", None, "pack.py"))
