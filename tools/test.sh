#!/usr/bin/env bash
# The test suite: install what is missing, then run every test (builds happen inside the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/setup.sh
exec "$PY" -m pytest -q tests "$@"
