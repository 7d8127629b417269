#!/usr/bin/env bash
# bench/gpu/batch.sh - several bench scripts in one device call, each part
# under its own time limit, their results packed so that they fit the
# device tool's return (at most 8 files): one PART.tgz per part plus
# batch.log. A device call costs a machine start (a minute or more), so the
# runs that belong to one session go into one call.
#
#   bash bench/gpu/batch.sh NAME:SECONDS:'VAR=x bash bench/...' [...]
#
# Each part runs with OUT=$OUT/NAME (its own empty folder), stdout and stderr
# to $OUT/NAME/part.log; its exit status and wall time go to batch.log. A
# part that runs past SECONDS is stopped (TERM, then KILL 10 s later) and
# the next one starts. Before the first part, compressed binaries that were
# carried (bin/*.xz, bin/*.gz) are unpacked next to themselves where the
# plain file is missing (the call's 64 MiB carry does not hold bin/slowrank
# uncompressed beside the other tools).
# Unpack a part here with: mkdir -p D && tar xzf PART.tgz -C D
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(pwd)/out/batch}
mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/batch.log"; }
[ $# -gt 0 ] || { echo "usage: batch.sh NAME:SECONDS:COMMAND ..." >&2; exit 2; }
for spec in "$@"; do
  IFS=: read -r name secs _ <<<"$spec"
  [[ $name =~ ^[A-Za-z0-9_-]+$ && $secs =~ ^[0-9]+$ ]] ||
    { echo "bad part '$spec': want NAME:SECONDS:COMMAND (NAME letters, digits, _ -)" >&2; exit 2; }
done
for z in bin/*.xz bin/*.gz; do
  [ -f "$z" ] || continue
  plain=${z%.*}
  [ -e "$plain" ] && continue
  python3 - "$z" "$plain" <<'PY' && chmod 755 "$plain" && log "unpacked $z"
import gzip, lzma, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
opener = lzma.open if src.endswith(".xz") else gzip.open
with opener(src) as f, open(dst, "wb") as o:
    shutil.copyfileobj(f, o)
PY
done
start=$SECONDS
for spec in "$@"; do
  name=${spec%%:*}
  rest=${spec#*:}
  secs=${rest%%:*}
  cmd=${rest#*:}
  dir=$OUT/$name
  mkdir -p "$dir"
  log "== $name (limit ${secs}s, t+$((SECONDS - start))s): $cmd"
  t0=$SECONDS
  OUT=$dir timeout -k 10 "$secs" bash -c "$cmd" >"$dir/part.log" 2>&1
  rc=$?
  log "== $name: rc $rc after $((SECONDS - t0))s$([ "$rc" = 124 ] && echo ' (time limit)')"
  tail -n 25 "$dir/part.log"
  tar czf "$OUT/$name.tgz" -C "$dir" . && rm -rf "$dir"
done
log "batch done after $((SECONDS - start))s"
