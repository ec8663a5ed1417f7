#!/usr/bin/env bash
# The whole test suite: installs dependencies when missing, builds, runs every test (C++
# GoogleTest suites, the example trainer as real processes, the find_package consumer, the
# Python tests), then builds the core with ThreadSanitizer and runs its suites again.
# Exit status is non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure --timeout 600

# ThreadSanitizer: the core alone (no torch/CUDA/Python), watchdog + progress + supervisor tests.
TRAINSUP_BUILD_DIR=build-tsan scripts/build.sh -DTRAINSUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
  -DTRAINSUP_WITH_TORCH=OFF -DTRAINSUP_WITH_CUDA=OFF -DTRAINSUP_WITH_PYTHON=OFF \
  -DTRAINSUP_BUILD_EXAMPLES=OFF -DTRAINSUP_BUILD_BENCH=OFF
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build-tsan -L core --output-on-failure --timeout 600
