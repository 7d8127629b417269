# shellcheck shell=bash
# Sourced first by the do-no-harm scripts (stress, coexist, idle_lib,
# c1matrix): `source "$(dirname "$0")/dnh_begin.sh" RESULTS_NAME WORK_NAME`.
# Results go to $OUT (the device tool's folder) or out/RESULTS_NAME; the
# scratch folder $DNH_WORK/WORK_NAME becomes $OUT for common.sh; the console
# is copied into it.
RESULTS=${OUT:-$(pwd)/out/$1}
export OUT=${DNH_WORK:-/var/tmp/slowrank-dnh}/$2
rm -rf "$OUT"
mkdir -p "$OUT" "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# shellcheck source=dnh_common.sh
source "$ROOT/bench/gpu/dnh_common.sh"
exec > >(tee -a "$OUT/console.log") 2>&1
