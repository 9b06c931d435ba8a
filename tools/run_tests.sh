#!/usr/bin/env bash
# Run the whole mmrobust test suite (sets the environment up first when needed; see
# tools/setup_env.sh). Extra arguments go to pytest, e.g. `bash tools/run_tests.sh -k toy`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust}
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest tests "$@"
