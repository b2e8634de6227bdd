#!/usr/bin/env bash
# The main job: install what is missing, build the firmware for the default board
# (x86_64_baremetal), pack the shipped demo model, run it under QEMU, print the answers and the
# verification against the numpy reference. BOARD=hosted bash tools/demo.sh runs it as a process.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/setup.sh
BOARD=${BOARD:-x86_64_baremetal}
"$PY" -m SCons -Q board="$BOARD" >/dev/null
exec "$PY" tools/demo.py --board "$BOARD" "$@"
