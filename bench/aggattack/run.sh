#!/usr/bin/env bash
# The attacks of issues 17 and 34 against `slowrank aggregate`, before and after:
#   bench/aggattack/run.sh [OLD_BINARY]
# builds this tree's slowrank (and takes OLD_BINARY, e.g. one built from an
# earlier commit, to compare), runs each attack against a fresh aggregator on
# 127.0.0.1 and prints what an honest agent saw and the aggregator's RSS.
set -euo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/new" ./cmd/slowrank
go build -o "$tmp/aggattack" ./bench/aggattack
echo tok > "$tmp/token"; chmod 600 "$tmp/token"
ulimit -n 20000
bins=(new)
[ $# -ge 1 ] && { cp "$1" "$tmp/old"; bins=(old new); }
port=43170
for bin in "${bins[@]}"; do
  for attack in none idle401 slowbodies bigtopo stalled connfill rankflood; do
    port=$((port + 1))
    "$tmp/$bin" aggregate --listen 127.0.0.1:$port --token-file "$tmp/token" --stats-every 0 --otel off 2>"$tmp/log" &
    pid=$!
    sleep 1
    echo -n "$bin: "
    timeout 120 "$tmp/aggattack" --addr 127.0.0.1:$port --token tok --pid $pid --attack $attack | tail -1
    kill $pid; wait $pid 2>/dev/null || true
  done
done
