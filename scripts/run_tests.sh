#!/usr/bin/env bash
# Fresh machine to test report: installs packages, builds, runs the whole suite with ctest.
# Without arguments (CI) it then builds and checks the GPU bundle when nvcc is present
# (scripts/gpu_bundle.sh, docs/CUDA.md "The GPU bundle"; CTX_SKIP_BUNDLE=1 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
# HF tokenizers (parity tests) and transformers (model reference tests) in venvs under the build
# dir; the tests report "skipped" when these cannot be had
bash scripts/setup_python.sh "${BUILD_DIR:-build}/pyenv" "${BUILD_DIR:-build}/pyenv-hf"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ctest runs tests side by side, each with an OpenMP team as wide as the machine: threads that
# spin at barriers then wait for descheduled team mates, and a test of many small parallel
# regions (the rotary finite-difference checks) went from 16 s to over 230 s. Idle threads sleep.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j "${JOBS:-$(nproc)}" "$@")
if [[ $# -eq 0 && "${CTX_SKIP_BUNDLE:-0}" != 1 ]]; then
  if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
    BUILD_DIR=build-bundle JOBS="${JOBS:-$(nproc)}" bash scripts/gpu_bundle.sh
  else
    echo "run_tests: no nvcc, so no GPU bundle (scripts/gpu_bundle.sh)"
  fi
fi
