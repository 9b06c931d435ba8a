#!/usr/bin/env bash
# Distributed testing with torchrun: NCCL on GPUs, gloo on CPU.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NPROC [test.py args ...]
#   TOOL=test_robustness.py bash tools/dist_test.sh CONFIG CHECKPOINT NPROC --protocol benchmark
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python}
TOOL=${TOOL:-test.py}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$ROOT/tools/$TOOL" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
