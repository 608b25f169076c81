#!/usr/bin/env bash
# Check the Prefect UI of a training run in a real browser (not run in CI).
#
#   scripts/prefect_ui_screenshot.sh [OUT_DIR] [-- extra `trace-rl train` options]
#
# Starts a throwaway `prefect server` on a free port, trains the small CI config for one iteration
# against it (so the stages exist as task runs, with their table and markdown artifacts), then
# takes headless Chromium screenshots (Debian's `chromium` package) of
#   OUT_DIR/prefect-ui.png             the training flow run: one task run per stage, on its timeline
#   OUT_DIR/prefect-ui-artifacts.png   the artifact list (per-iteration allocation + metrics keys)
#   OUT_DIR/prefect-ui-allocation.png  the allocation table artifact of iteration 0
#   OUT_DIR/prefect-ui-metrics.png     the metrics markdown artifact of iteration 0
# OUT_DIR defaults to docs/. Example with a model other than the shipped checkpoint:
#   scripts/prefect_ui_screenshot.sh /tmp/shots -- --set model.path=/tmp/tinyrand
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/docs}"; shift || true
[[ "${1:-}" == "--" ]] && shift
PY="${PYTHON:-$ROOT/.venv/bin/python}"
BIN="$(dirname "$PY")"
CHROME="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
[[ -x "$CHROME" ]] || { echo "needs Chromium: apt-get install -y chromium" >&2; exit 2; }
mkdir -p "$OUT"; OUT="$(cd "$OUT" && pwd)"

STATE="$(mktemp -d -t trace-ui-XXXXXX)"
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export PREFECT_HOME="$STATE/prefect" XDG_CONFIG_HOME="$STATE/xdg"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api" PREFECT_SERVER_ANALYTICS_ENABLED=false
export DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, even where it is not pip-installed
UI="http://127.0.0.1:$PORT"

# the server runs in its own process group: the trap ends it and everything it started
setsid "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" >"$STATE/server.log" 2>&1 &
SERVER=$!
cleanup() {
  kill -TERM -- "-$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT

for _ in $(seq 150); do
  curl -fs "$PREFECT_API_URL/health" >/dev/null 2>&1 && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$STATE/server.log" >&2; exit 1; }
  sleep 1
done
curl -fs "$PREFECT_API_URL/health" >/dev/null || { echo "prefect server not healthy" >&2; exit 1; }
echo "prefect server at $UI"

cd "$ROOT"
"$BIN/trace-rl" train --config configs/small-ci.yaml --set run.iterations=1 --home "$STATE/home" \
  --run-id ui "$@" >"$STATE/train.log" 2>&1 || { tail -40 "$STATE/train.log" >&2; exit 1; }

# ids of the training flow run and of its two artifacts (allocation table, metrics markdown)
read -r RUN TABLE MARKDOWN < <("$PY" - <<'EOF'
import os, httpx
api = os.environ["PREFECT_API_URL"]
runs = httpx.post(f"{api}/flow_runs/filter", json={"flows": {"name": {"any_": ["trace-train"]}},
                  "sort": "START_TIME_DESC", "limit": 1}).json()
ids = [httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"type": {"any_": [kind]}},
                  "sort": "CREATED_DESC", "limit": 1}).json() for kind in ("table", "markdown")]
print(runs[0]["id"], *[a[0]["id"] if a else "-" for a in ids])
EOF
)
echo "flow run $UI/runs/flow-run/$RUN"

shot() {  # shot URL FILE: headless Chromium; virtual time lets the single-page app fetch and render
  "$CHROME" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$(mktemp -d -p "$STATE")" --window-size=1400,1000 --hide-scrollbars \
    --virtual-time-budget=15000 --screenshot="$2" "$1" >>"$STATE/chromium.log" 2>&1
  echo "wrote $2"
}
# the flow run opens on its Logs tab (a ?tab= link is reset while the run loads); its timeline
# graph above the tabs draws every stage as a task run
shot "$UI/runs/flow-run/$RUN" "$OUT/prefect-ui.png"
shot "$UI/artifacts" "$OUT/prefect-ui-artifacts.png"
[[ "$TABLE" != - ]] && shot "$UI/artifacts/artifact/$TABLE" "$OUT/prefect-ui-allocation.png"
[[ "$MARKDOWN" != - ]] && shot "$UI/artifacts/artifact/$MARKDOWN" "$OUT/prefect-ui-metrics.png"
exit 0
