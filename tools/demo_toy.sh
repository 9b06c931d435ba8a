#!/usr/bin/env bash
# The main job on the embedded default: generate the toy COCO set, train a Mask R-CNN on the CPU
# in a few minutes, evaluate it (box and mask AP) and say where the checkpoint and logs went.
#   bash tools/demo_toy.sh [CONFIG] [extra train.py args]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust}
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$VENV/bin/python" ]; then PYTHON="$VENV/bin/python"; else PYTHON=python; fi
fi
CONFIG=${1:-configs/toy/mask-rcnn_fan-t-hybrid_fpn_toy-coco.py}
NAME=$(basename "$CONFIG" .py)
WORK_DIR=${WORK_DIR:-work_dirs/demo_$NAME}
cd "$ROOT"

"$PYTHON" data/generate_toy_data.py --only toy_coco toy_cityscapes
"$PYTHON" tools/train.py "$CONFIG" --work-dir "$WORK_DIR" "${@:2}"
CHECKPOINT=$(cat "$WORK_DIR/last_checkpoint")
"$PYTHON" tools/test.py "$CONFIG" "$CHECKPOINT" --work-dir "$WORK_DIR/test"
echo
echo "checkpoint: $CHECKPOINT"
echo "train logs: $(ls -d "$ROOT/$WORK_DIR"/2*/ | tail -n 1)"
echo "test logs:  $(ls -d "$ROOT/$WORK_DIR/test"/2*/ | tail -n 1)"
