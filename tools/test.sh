#!/usr/bin/env bash
# The test suite: install what is missing, then run every test (builds happen inside the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec python3 -m pytest -q tests "$@"
