#!/usr/bin/env bash
# Check that `trace-rl report` renders in a real browser, offline (not run in CI).
#
#   scripts/report_screenshot.sh [OUT_PNG] [HOME RUN]
#
# With HOME and RUN: renders the report of that run. Without: trains the shipped tiny config
# (`trace-rl train`, its own temporary Prefect server) into a throwaway home as run `report-demo`
# first. Writes a full-page screenshot of the page (`trace-rl report` writes the HTML) taken by
# headless Chromium (Debian's `chromium` package) with every host name unresolvable, so anything
# the page tried to load from the network would be missing from the picture.
# OUT_PNG defaults to docs/report.png.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/docs/report.png}"
HOME_DIR="${2:-}"; RUN="${3:-}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
BIN="$(dirname "$PY")"
CHROME="${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}"
[[ -x "$CHROME" ]] || { echo "needs Chromium: apt-get install -y chromium" >&2; exit 2; }
[[ -n "$HOME_DIR" && -z "$RUN" ]] && { echo "usage: $0 [OUT_PNG] [HOME RUN]" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"; OUT="$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")"
STATE="$(mktemp -d -t trace-report-XXXXXX)"
HTML="$STATE/report.html"
trap 'rm -rf "$STATE"' EXIT
export DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true PREFECT_HOME="$STATE/prefect"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # the checkout, even where it is not pip-installed
cd "$ROOT"

if [[ -z "$HOME_DIR" ]]; then
  HOME_DIR="$STATE/home"; RUN=report-demo
  start=$(date +%s)
  "$BIN/trace-rl" train --home "$HOME_DIR" --run-id "$RUN" >"$STATE/train.log" 2>&1 \
    || { tail -40 "$STATE/train.log" >&2; exit 1; }
  echo "trained $RUN in $(( $(date +%s) - start )) s"
fi

start=$(date +%s.%N)
"$BIN/trace-rl" report "$RUN" --home "$HOME_DIR" --out "$HTML"
echo "report in $(echo "$(date +%s.%N) - $start" | bc) s"

# a tall window holds the whole page; the empty band below it is cut off afterwards
"$CHROME" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --host-resolver-rules="MAP * ~NOTFOUND" --user-data-dir="$STATE/chromium" \
  --window-size=1280,6000 --hide-scrollbars --virtual-time-budget=5000 \
  --screenshot="$STATE/full.png" "file://$HTML" >"$STATE/chromium.log" 2>&1 \
  || { cat "$STATE/chromium.log" >&2; exit 1; }
"$PY" - "$STATE/full.png" "$OUT" <<'PYEOF'
import sys
from PIL import Image, ImageChops

img = Image.open(sys.argv[1]).convert("RGB")
bg = Image.new("RGB", img.size, img.getpixel((img.width - 1, img.height - 1)))
box = ImageChops.difference(img, bg).getbbox()
bottom = min(img.height, (box[3] if box else img.height) + 24)
img.crop((0, 0, img.width, bottom)).save(sys.argv[2], optimize=True)
print(f"wrote {sys.argv[2]} ({img.width}x{bottom})")
PYEOF
