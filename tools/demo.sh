#!/usr/bin/env bash
# The main job: install what is missing, build the firmware for the default board, pack the
# shipped demo model, run it on the board and verify the device against the numpy reference.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
BOARD=${BOARD:-hosted}
MODEL=${MODEL:-models/tiny-random-mixtral}
mkdir -p out
python3 -m SCons -Q board="$BOARD" >/dev/null
python3 host/pack.py "$MODEL" -o out/demo.img --max-seq 64
python3 host/flash.py out/demo.img --board "$BOARD" --prompt-tokens 1,5,9,3 --max-new-tokens 16 --verify
