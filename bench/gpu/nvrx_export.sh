#!/usr/bin/env bash
# NVIDIA's nvidia-resiliency-ext (NVRx) straggler detection for the
# sensitivity bench (bench/gpu/sensitivity.sh RUNS=nvrx), without committing
# its code to this repository.
#
#   NVRX_SRC=DIR bash bench/gpu/nvrx_export.sh export [COMMIT]
#       (development machine) DIR is an NVRx git repository (bare or not,
#       e.g. the `fetch` tool's mirror); exports COMMIT (default HEAD) into
#       .nvrx/ (ignored by git; carry it): its straggler package
#       (src/nvidia_resiliency_ext/attribution/straggler, with the CUPTI
#       extension's sources), the package's top __init__.py and its licence,
#       and an empty attribution/__init__.py of ours (NVRx's own imports the
#       log analyzer and its dependencies, which the straggler package does
#       not use). .nvrx/COMMIT names the commit.
#   bash bench/gpu/nvrx_export.sh build
#       (GPU machine) builds the CUPTI extension, nvrx_cupti_module, into
#       .nvrx/lib/ with g++, pybind11 and -lcupti, as NVRx's build.py does
#       (its cupti_src/*.cpp, -O3, C++17): CUPTI's header and library are
#       looked for under CUDA_HOME (/usr/local/cuda) and then in the Python
#       environment's nvidia-cuda-cupti wheel; NVRX_CFLAGS adds flags. Prints
#       the PYTHONPATH to use.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEST=$ROOT/.nvrx
PKG=src/nvidia_resiliency_ext

export_src() {
  local commit=${1:-HEAD} sha
  [ -n "${NVRX_SRC:-}" ] || { echo "nvrx_export.sh: set NVRX_SRC to an NVRx git repository" >&2; exit 2; }
  sha=$(git -C "$NVRX_SRC" rev-parse --verify "$commit^{commit}")
  rm -rf "$DEST"
  mkdir -p "$DEST"
  git -C "$NVRX_SRC" archive "$sha" "$PKG/__init__.py" "$PKG/attribution/straggler" LICENSE.txt | tar -x -C "$DEST"
  echo "# Empty here (bench/gpu/nvrx_export.sh): NVRx's own imports its log analyzer." >"$DEST/$PKG/attribution/__init__.py"
  {
    echo "$sha"
    git -C "$NVRX_SRC" log -1 --format='%cI %s' "$sha"
  } >"$DEST/COMMIT"
  echo "exported NVRx $(head -c 12 "$DEST/COMMIT") into $DEST ($(du -sh "$DEST" | cut -f1))"
}

# find_one PATTERN DIR...: the first file under the DIRs whose path ends in
# PATTERN (include/cuda.h: never linux/cuda.h).
find_one() {
  local name=$1 d f
  shift
  for d in "$@"; do
    [ -d "$d" ] || continue
    f=$(find -L "$d" -path "*/$name" -print -quit 2>/dev/null)
    if [ -n "$f" ]; then echo "$f"; return 0; fi
  done
  return 1
}

build() {
  local py=${PYTHON:-python3} cuda=${CUDA_HOME:-/usr/local/cuda} site hdr lib cudah inc ext out
  [ -f "$DEST/COMMIT" ] || { echo "no $DEST/COMMIT: run 'nvrx_export.sh export' on the development machine and carry .nvrx" >&2; exit 2; }
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  hdr=$(find_one include/cupti.h "$cuda/include" "$cuda/extras/CUPTI/include" "$cuda/targets" "$site/nvidia") ||
    { echo "no cupti.h under $cuda or $site/nvidia" >&2; exit 1; }
  lib=$(find_one 'libcupti.so' "$cuda/lib64" "$cuda/extras/CUPTI/lib64" "$cuda/targets" "$cuda/lib" "$site/nvidia") ||
    lib=$(find_one 'libcupti.so.*' "$cuda/lib64" "$cuda/extras/CUPTI/lib64" "$cuda/targets" "$cuda/lib" "$site/nvidia") ||
    { echo "no libcupti.so under $cuda or $site/nvidia" >&2; exit 1; }
  # cupti.h includes cuda.h: a toolkit has it beside, the pip wheels elsewhere.
  cudah=$(find_one include/cuda.h "$cuda/include" "$cuda/targets" "$site/nvidia") && inc="-I$(dirname "$cudah")" || inc=
  inc="$inc $("$py" -m pybind11 --includes) ${NVRX_CFLAGS:-}"
  ext=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  out=$DEST/lib/nvrx_cupti_module$ext
  mkdir -p "$DEST/lib"
  # shellcheck disable=SC2086 # inc is a list of -I flags
  g++ -O3 -std=c++17 -shared -fPIC -fvisibility=hidden $inc -I"$(dirname "$hdr")" \
    "$DEST/$PKG"/attribution/straggler/cupti_src/*.cpp \
    "$lib" -Wl,-rpath,"$(dirname "$lib")" -o "$out"
  echo "built $out against $hdr and $lib (NVRx $(head -c 12 "$DEST/COMMIT"))"
  echo "PYTHONPATH=$DEST/src:$DEST/lib"
}

case ${1:-} in
  export) export_src "${2:-HEAD}" ;;
  build) build ;;
  *) echo "usage: NVRX_SRC=DIR nvrx_export.sh export [COMMIT] | nvrx_export.sh build" >&2; exit 2 ;;
esac
