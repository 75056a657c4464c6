#!/usr/bin/env bash
# Builds the self-contained GPU bundle here and checks it (docs/CUDA.md "The GPU bundle"):
# ctxengine, its plugins, the gpu test executables, `ctxengine bench`, the runner (run.sh) and
# gpu_validate.sh, for sm_80 and sm_90, needing only glibc and the CUDA libraries on the GPU
# machine.
#
#   bash scripts/gpu_bundle.sh           configure + build (BUILD_DIR), install (BUNDLE), check
#   bash scripts/gpu_bundle.sh --check   only check an existing bundle (scripts/gpu_bundle_check.sh)
#
# Environment: BUILD_DIR (default build-bundle), BUNDLE (default build-gpu-bundle; both git-
# ignored), JOBS (default 2), NCCL=AUTO|ON|OFF (default AUTO: linked when found),
# CTX_BUNDLE_MARCH (default x86-64-v3: AVX2, which every A100/H100 host has).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-bundle}
BUNDLE=${BUNDLE:-build-gpu-bundle}
JOBS=${JOBS:-2}
NCCL=${NCCL:-AUTO}
MARCH=${CTX_BUNDLE_MARCH:-x86-64-v3}

if [[ "${1:-}" == --check ]]; then
    exec bash scripts/gpu_bundle_check.sh "$BUNDLE"
elif [[ -n "${1:-}" ]]; then
    sed -n 2,13p "$0"
    exit 2
fi

if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    echo "gpu_bundle: needs nvcc (the CUDA toolkit, /usr/local/cuda/bin/nvcc) to build the bundle" >&2
    exit 1
fi
# Never delete something that is not a bundle we made.
if [[ -e "$BUNDLE" && ! -f "$BUNDLE/BUNDLE_INFO.txt" && -n "$(ls -A "$BUNDLE" 2>/dev/null)" ]]; then
    echo "gpu_bundle: $BUNDLE exists and is not a bundle (no BUNDLE_INFO.txt); not replacing it" >&2
    exit 1
fi

t0=$(date +%s)
mkdir -p "$BUILD_DIR"
LOG="$BUILD_DIR/gpu_bundle.configure.log"
nice -n 10 cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DCTX_BUNDLE=ON -DCTX_MPI=OFF -DCTX_NATIVE=OFF -DCTX_BUILD_BENCHMARKS=OFF \
    -DCTX_CUDA=ON -DCTX_NCCL="$NCCL" \
    -DCMAKE_C_FLAGS="-march=$MARCH" -DCMAKE_CXX_FLAGS="-march=$MARCH" >"$LOG" 2>&1 ||
    { cat "$LOG" >&2; echo "gpu_bundle: configure failed" >&2; exit 1; }
grep -E "^-- (CUDA backend|NCCL|MPI|Bundle):" "$LOG" || true
nice -n 10 cmake --build "$BUILD_DIR" --target gpu_bundle -j "$JOBS"
t_build=$(($(date +%s) - t0))

rm -rf "$BUNDLE"
cmake --install "$BUILD_DIR" --prefix "$BUNDLE" --strip >/dev/null
cp scripts/gpu_bundle_run.sh "$BUNDLE/run.sh"
cp scripts/gpu_validate.sh "$BUNDLE/gpu_validate.sh"
chmod +x "$BUNDLE/run.sh" "$BUNDLE/gpu_validate.sh"
cp -r recipes "$BUNDLE/recipes"
if [[ -f benchmarks/sdpa_peer.py ]]; then
    mkdir -p "$BUNDLE/benchmarks" && cp benchmarks/sdpa_peer.py "$BUNDLE/benchmarks/"
fi
nccl_line=$(grep -E "^-- NCCL:" "$LOG" | sed 's/^-- //' || true)
{
    echo "ctxengine GPU bundle, $(git describe --always --dirty 2>/dev/null || echo unknown) ($(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo '?'))"
    echo "built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    echo "CUDA: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || nvcc --version | grep -o 'release [0-9.]*'), sm_80 + sm_90 (+ compute_90 PTX)"
    echo "${nccl_line:-NCCL: ?}; MPI: none (single process); host code -march=$MARCH"
} >"$BUNDLE/BUNDLE_INFO.txt"
echo "gpu_bundle: built in ${t_build}s, installed into $BUNDLE"

bash scripts/gpu_bundle_check.sh "$BUNDLE"
echo "gpu_bundle: done in $(($(date +%s) - t0))s. Ship it: the device tool's carry [\"$BUNDLE\"], then" \
     "on the device: bash $BUNDLE/gpu_validate.sh (output in \$OUT)"
