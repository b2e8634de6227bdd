#!/usr/bin/env python3
"""`python tools/routing_report.py ...` in a checkout: the same as `colibri report ...` once installed (colibri/routing_report.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from colibri.routing_report import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
