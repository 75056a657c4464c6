#!/usr/bin/env bash
# Fresh machine to first result: installs packages, builds, runs the main job on the embedded
# default data (CPU). Extra arguments go to ctxengine before the recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
RECIPE=${RECIPE:-recipes/smoke.lua}
exec ./build/ctxengine "$@" "$RECIPE"
