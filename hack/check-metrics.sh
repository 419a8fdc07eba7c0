#!/usr/bin/env bash
# `promtool check metrics` on a live /metrics: start a throwaway SQLite sidecar, scrape, lint.
set -euo pipefail
VENV="${VENV:-.venv}"
tmp="$(mktemp -d)"
free_port() { "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port="$(free_port)"
app_port="$(free_port)"
# A stand-in app that accepts connections: a sidecar only competes (and so reports ready and
# exports its leadership) while its app is reachable.
"$VENV/bin/python" -m http.server --bind 127.0.0.1 "$app_port" >"$tmp/app.log" 2>&1 &
app=$!
SCHEDLOCK_DATABASE_URL="sqlite:///$tmp/lint.db" SCHEDLOCK_TARGET=lint SCHEDLOCK_HTTP_HOST=127.0.0.1 \
  SCHEDLOCK_TARGET_URL="http://127.0.0.1:$app_port/schedlock" \
  SCHEDLOCK_HTTP_PORT="$port" "$VENV/bin/schedlock" sidecar >"$tmp/sidecar.log" 2>&1 &
pid=$!
trap 'kill "$pid" "$app" 2>/dev/null; wait "$pid" "$app" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do
  if "$VENV/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/readyz', timeout=1)" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
"$VENV/bin/python" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$port/metrics').read().decode(), end='')" >"$tmp/metrics.txt"
grep -q '^schedlock_leader{' "$tmp/metrics.txt" || { echo "no schedlock_leader series in /metrics" >&2; cat "$tmp/sidecar.log" >&2; exit 1; }
"$(bash hack/tools.sh bindir promtool)/promtool" check metrics <"$tmp/metrics.txt"
echo "promtool check metrics: $(grep -c '^# HELP' "$tmp/metrics.txt") metric families OK"
