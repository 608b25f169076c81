#!/usr/bin/env bash
# Fetch BFCL's reference checker and data (the bfcl-eval wheel, never installed) into DIR.
#   scripts/fetch-bfcl-eval.sh [DIR]      (default: ${TRACE_BFCL_EVAL_DIR:-$HOME/.cache/trace-rl/bfcl-eval})
# Afterwards DIR/bfcl_eval/data holds the data files and DIR/bfcl_eval/eval_checker the AST checker.
# Idempotent: a DIR that already holds the unpacked wheel of this version is left as it is.
set -euo pipefail
VERSION=2026.3.23
DIR=${1:-${TRACE_BFCL_EVAL_DIR:-$HOME/.cache/trace-rl/bfcl-eval}}
STAMP="$DIR/.bfcl-eval-$VERSION"
if [ -f "$STAMP" ] && [ -d "$DIR/bfcl_eval/data/possible_answer" ]; then
  echo "bfcl-eval $VERSION already in $DIR"
  exit 0
fi
mkdir -p "$DIR"
WHEEL="$DIR/bfcl_eval-$VERSION-py3-none-any.whl"
# a Python with pip: $PYTHON, python3, or the project's .venv
PY=""
for cand in "${PYTHON:-}" python3 "$(dirname "$0")/../.venv/bin/python"; do
  if [ -n "$cand" ] && "$cand" -m pip --version >/dev/null 2>&1; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then echo "fetch-bfcl-eval.sh: no Python with pip found (set PYTHON=...)" >&2; exit 2; fi
if [ ! -f "$WHEEL" ]; then
  "$PY" -m pip download --quiet --no-deps "bfcl-eval==$VERSION" -d "$DIR"
fi
"$PY" - "$WHEEL" "$DIR" <<'PYEOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2])
PYEOF
touch "$STAMP"
echo "bfcl-eval $VERSION unpacked in $DIR"
