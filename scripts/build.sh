#!/usr/bin/env bash
# Configures and builds trainsup into ${TRAINSUP_BUILD_DIR:-build}. Extra arguments go to cmake.
# Always uses /usr/bin/python3 for the bindings (a pyenv `python3` on PATH has no torch).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${TRAINSUP_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DPython_EXECUTABLE=/usr/bin/python3 "$@"
cmake --build "$build_dir" -j"$(nproc)"
