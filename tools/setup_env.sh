#!/usr/bin/env bash
# Set up mmrobust in one command: a virtualenv with the verified OpenMMLab stack and mmrobust
# (editable). Safe to rerun: the stack is reinstalled only when requirements change, and the
# editable install is re-pointed at this checkout every time (seconds).
#
#   bash tools/setup_env.sh                  # venv at $MMROBUST_VENV (default ~/.venvs/mmrobust)
#   bash tools/setup_env.sh --stack oldest   # the floor: torch 2.1.2 (OpenMMLab's prebuilt mmcv
#                                            # 2.1.0 stops there), default ~/.venvs/mmrobust-oldest
#                                            # (or MMROBUST_STACK=oldest, as run_tests.sh passes)
#
# The first run builds mmcv 2.1.0 with its C++ ops from source (~20 min on 2 cores); pip keeps
# the built wheel in its cache, so later runs and new venvs on the same machine take minutes.
# On a machine whose torch sees a GPU, mmcv's CUDA ops are built for that GPU: that needs nvcc
# of torch's CUDA version (tools/cuda_env.sh checks before building and says what to install).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STACK=${MMROBUST_STACK:-current}
while [ $# -gt 0 ]; do
  case "$1" in
    --stack) STACK=${2:-}; shift 2 ;;
    --stack=*) STACK=${1#--stack=}; shift ;;
    *) echo "setup_env.sh: unknown argument $1 (use --stack current|oldest)" >&2; exit 2 ;;
  esac
done
case "$STACK" in
  current) TORCH=2.13.0; CONSTRAINT_FILE=constraints.txt
           VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust} ;;
  oldest) TORCH=2.1.2; CONSTRAINT_FILE=constraints-oldest.txt
          VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust-oldest} ;;
  *) echo "setup_env.sh: --stack is current or oldest, not '$STACK'" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "mmrobust's stack is verified on Python 3.11; $PYTHON is $("$PYTHON" --version 2>&1)." >&2
  echo "Point PYTHON at a Python 3.11 interpreter: PYTHON=python3.11 bash tools/setup_env.sh" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
CONSTRAINTS=(-c "$ROOT/requirements/$CONSTRAINT_FILE")
STAMP="$VENV/.mmrobust-stack"
STACK_HASH=$( { echo "$STACK"; cat "$ROOT/requirements.txt" "$ROOT"/requirements/*.txt \
  "$ROOT/tools/setup_env.sh" "$ROOT/tools/cuda_env.sh"; } | sha256sum | cut -c1-16)
# shellcheck source=cuda_env.sh
source "$ROOT/tools/cuda_env.sh"

if [ "$(cat "$STAMP" 2>/dev/null)" != "$STACK_HASH" ]; then
  echo "== installing the mmrobust stack into $VENV"
  "${PIP[@]}" install "${CONSTRAINTS[@]}" "torch==$TORCH"
  # after torch, which would pull setuptools >= 77 (see requirements/build.txt)
  "${PIP[@]}" install "${CONSTRAINTS[@]}" -r "$ROOT/requirements/build.txt"
  if [ "$STACK" = current ]; then
    echo "== note: an 'ERROR: pip's dependency resolver ...' line above saying torch requires" \
      "setuptools>=77 is expected: mmcv's build needs setuptools<70, and torch needs the newer" \
      "one only to compile extensions (requirements/build.txt)"
  fi
  # CUDA ops when torch sees a GPU: stops here, before the build, if nvcc is missing
  mmrobust_cuda_env "$VENV/bin/python" || exit 1
  # mmcv's setup.py imports torch to compile its ops, hence no build isolation. pip caches the
  # built wheel by mmcv's version only, so each stack keeps its own cache: a wheel built against
  # another torch fails at import (undefined symbols in mmcv._ext)
  cache=()
  [ "$STACK" = current ] || cache=(--cache-dir "$VENV/.pip-cache")
  MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    "${PIP[@]}" install "${cache[@]}" "${CONSTRAINTS[@]}" --no-build-isolation mmcv==2.1.0
  "${PIP[@]}" install "${CONSTRAINTS[@]}" -r "$ROOT/requirements.txt" -r "$ROOT/requirements/tests.txt"
  # OpenMMLab's `mim` without its declared opendatalab (a dataset downloader no mim command used
  # here imports), which would pin setuptools, requests and tqdm down; its imports are in
  # requirements/tests.txt. pip's later "openmim requires opendatalab" notes are this.
  "${PIP[@]}" install "${CONSTRAINTS[@]}" --no-deps openmim==0.3.9
  echo "$STACK_HASH" > "$STAMP"
fi

"${PIP[@]}" install -q "${CONSTRAINTS[@]}" --no-deps --no-build-isolation -e "$ROOT"
"$VENV/bin/python" - <<'PY'
import mmcv, mmdet, mmengine, mmseg, torch
from mmcv.ops import RoIAlign  # noqa: F401  (fails when mmcv was built without its ops)
from mmcv.ops import get_compiling_cuda_version
import mmrobust
if torch.cuda.is_available() and get_compiling_cuda_version() == 'not available':
    raise SystemExit('mmcv was built without CUDA ops but torch sees a GPU: pip reused a CPU '
                     'build from its cache. Run `pip cache remove mmcv`, delete '
                     f'{__import__("sys").prefix}/.mmrobust-stack and rerun tools/setup_env.sh.')
print(f'mmrobust {mmrobust.__version__} ready: torch {torch.__version__} (CUDA '
      f'{torch.version.cuda}, GPU {"yes" if torch.cuda.is_available() else "no"}), mmengine '
      f'{mmengine.__version__}, mmcv {mmcv.__version__}, mmdet {mmdet.__version__}, '
      f'mmseg {mmseg.__version__}')
PY
echo "Activate it with:  source $VENV/bin/activate"
