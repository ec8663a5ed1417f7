#!/usr/bin/env bash
# The whole test suite: installs dependencies when missing, builds, runs every test (C++
# GoogleTest suites, the example trainer as real processes, the find_package consumer, the
# Python tests), then runs the core's suites again under ThreadSanitizer.
# Exit status is non-zero when anything fails.
#
# The ThreadSanitizer build (the core alone: no torch/CUDA/Python) compiles in the background at
# the lowest CPU priority while the main suite runs: the suite's processes mostly wait (on
# sleeps, sockets and timeouts), and `nice -n 19` leaves them the CPU whenever they want it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
tsan_log=$(mktemp)
( nice -n 19 env TRAINSUP_BUILD_DIR=build-tsan scripts/build.sh -DTRAINSUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
    -DTRAINSUP_WITH_TORCH=OFF -DTRAINSUP_WITH_CUDA=OFF -DTRAINSUP_WITH_PYTHON=OFF \
    -DTRAINSUP_BUILD_EXAMPLES=OFF -DTRAINSUP_BUILD_BENCH=OFF >"$tsan_log" 2>&1 ) &
tsan_build=$!
trap 'kill $tsan_build 2>/dev/null || true; rm -f "$tsan_log"' EXIT
ctest --test-dir build --output-on-failure --timeout 600

# ThreadSanitizer: watchdog, progress, supervisor, checkpoint, telemetry, ... (every core test).
if ! wait "$tsan_build"; then
  cat "$tsan_log" >&2
  echo "test.sh: the ThreadSanitizer build failed" >&2
  exit 1
fi
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build-tsan -L core --output-on-failure --timeout 600
