#!/usr/bin/env bash
# Run the whole mmrobust test suite (sets the environment up first when needed; see
# tools/setup_env.sh): ruff (the rules in pyproject.toml), then pytest. Extra arguments go to
# pytest, e.g. `bash tools/run_tests.sh -m "not slow"` (the quick tier, no end-to-end trainings)
# or `bash tools/run_tests.sh -k toy`. The exit status is non-zero when either fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust}
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
lint=0
echo "== ruff check"
"$VENV/bin/python" -m ruff check . || lint=$?
tests=0
"$VENV/bin/python" -m pytest tests "$@" || tests=$?
if [ "$lint" -ne 0 ]; then
  echo "ruff found style errors (see above); \`$VENV/bin/python -m ruff check --fix .\` fixes" \
    "the import order and unused imports" >&2
fi
[ "$tests" -eq 0 ] && exit "$lint"
exit "$tests"
