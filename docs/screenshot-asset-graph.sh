#!/usr/bin/env bash
# Regenerate docs/asset-graph.png from a running `kindex up` (Debian's chromium, headless).
# usage: docs/screenshot-asset-graph.sh [PORT] [OUT]
set -euo pipefail
port="${1:-3000}"
out="${2:-$(dirname "$0")/asset-graph.png}"
# Dagster shows a "join the community" dialog on localhost until it is marked seen.
curl -fsS -X POST -H 'Content-Type: application/json' -d '{"query":"mutation { setNuxSeen }"}' \
  "http://127.0.0.1:${port}/graphql" >/dev/null
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --window-size=1600,1000 --virtual-time-budget=15000 \
  --screenshot="$(realpath -m "$out")" "http://127.0.0.1:${port}/asset-groups/kindex" 2>/dev/null
echo "wrote $out"
