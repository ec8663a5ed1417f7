#!/usr/bin/env bash
# Configures and builds trainsup into ${TRAINSUP_BUILD_DIR:-build} with the project's virtual
# environment (scripts/install-deps.sh makes it): its python, torch, pybind11, cmake and ninja.
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TRAINSUP_VENV:-$PWD/.venv}
build_dir=${TRAINSUP_BUILD_DIR:-build}
if [[ ! -x $venv/bin/python ]]; then
  echo "build: no virtual environment at $venv; run scripts/install-deps.sh first" >&2
  exit 1
fi
"$venv/bin/cmake" -S . -B "$build_dir" -G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
  -DPython_EXECUTABLE="$venv/bin/python" "$@"
"$venv/bin/cmake" --build "$build_dir" -j"$(nproc)"
