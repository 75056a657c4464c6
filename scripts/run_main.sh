#!/usr/bin/env bash
# Fresh machine to first result: installs packages, builds, and runs the main job on the embedded
# default (the generated long-document corpus, CPU): recipes/chunk_025.lua under mpirun -np 2.
# It trains two small base models at Lt (reused when runs/base_* exist), extends them to 4 Lt
# with chunk-0.25 rows and prints the perplexity table. Extra arguments go to the recipe.
# DEVICE=auto (or cuda) runs it on GPUs instead (one rank per GPU; docs/CUDA.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe -np "${NP:-2}" ./build/ctxengine --device "${DEVICE:-cpu}" \
    recipes/chunk_025.lua "$@"
