#!/usr/bin/env bash
# Run mmrobust's tests (sets the environment up first when needed; see tools/setup_env.sh):
# ruff (the rules in pyproject.toml), then pytest.
#
#   bash tools/run_tests.sh --quick     after every change: ruff and the quick tier (no
#                                       end-to-end training, no trained detector), < 3 min
#   bash tools/run_tests.sh             ruff and the whole suite: what CI runs (.ci/run)
#
# Other arguments go to pytest, e.g. `bash tools/run_tests.sh -k toy` or `-m slow`. The tests run
# in $MMROBUST_TEST_WORKERS pytest-xdist workers (default 2; 1 runs them in this process, e.g.
# to debug with --pdb). The exit status is non-zero when either ruff or pytest fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# MMROBUST_STACK=oldest: the floor stack of tools/setup_env.sh, in its own venv
if [ "${MMROBUST_STACK:-current}" = oldest ]; then
  VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust-oldest}
else
  VENV=${MMROBUST_VENV:-$HOME/.venvs/mmrobust}
fi
WORKERS=${MMROBUST_TEST_WORKERS:-2}
args=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then args+=(-m "not slow"); else args+=("$a"); fi
done
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
lint=0
echo "== ruff check"
"$VENV/bin/python" -m ruff check . || lint=$?
parallel=()
# NOTE: loadgroup keeps the tests of the trained demo detector in one worker (trained once)
[ "$WORKERS" -gt 1 ] && parallel=(-n "$WORKERS" --dist loadgroup)
tests=0
"$VENV/bin/python" -m pytest tests "${parallel[@]}" "${args[@]}" || tests=$?
if [ "$lint" -ne 0 ]; then
  echo "ruff found style errors (see above); \`$VENV/bin/python -m ruff check --fix .\` fixes" \
    "the import order and unused imports" >&2
fi
[ "$tests" -eq 0 ] && exit "$lint"
exit "$tests"
