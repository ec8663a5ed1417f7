#!/usr/bin/env bash
# The whole test suite: installs dependencies when missing, builds, runs every test (C++
# GoogleTest suites, the example trainer as real processes, the find_package consumer, the
# Python tests, the wheel), then runs the core's suites again under ThreadSanitizer.
# Exit status is non-zero when anything fails.
#
# Two long compiles run in the background at the lowest CPU priority while the main suite runs:
# the ThreadSanitizer build (the core alone: no torch/CUDA/Python) and `pip wheel .` (with
# build isolation, as a user runs it), which install.pip_wheel then checks. The suite's
# processes mostly wait (on sleeps, sockets and timeouts); `nice -n 19` leaves them the CPU
# whenever they want it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
venv=${TRAINSUP_VENV:-$PWD/.venv}
build_dir=${TRAINSUP_BUILD_DIR:-build}
wheel_dir=$PWD/$build_dir/wheel_prebuilt
bg_log=$(mktemp)
(
  set -e
  nice -n 19 env TRAINSUP_BUILD_DIR=build-tsan scripts/build.sh -DTRAINSUP_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug \
    -DTRAINSUP_WITH_TORCH=OFF -DTRAINSUP_WITH_CUDA=OFF -DTRAINSUP_WITH_PYTHON=OFF \
    -DTRAINSUP_BUILD_EXAMPLES=OFF -DTRAINSUP_BUILD_BENCH=OFF
  rm -rf "$wheel_dir"
  env -u PYTHONPATH nice -n 19 "$venv/bin/python" -m pip wheel -q --no-deps -w "$wheel_dir" .
) >"$bg_log" 2>&1 &
background=$!
trap 'kill $background 2>/dev/null || true; rm -f "$bg_log"' EXIT
ctest --test-dir "$build_dir" --output-on-failure --timeout 600 -E '^(install\.pip_wheel|layers\.thread_safety)$'

if ! wait "$background"; then
  cat "$bg_log" >&2
  echo "test.sh: the ThreadSanitizer build or the wheel build failed" >&2
  exit 1
fi
# The wheel's check (mostly pip installing it into a fresh venv), Clang's thread-safety analysis
# and the ThreadSanitizer run of the core's suites (watchdog, progress, supervisor, checkpoint,
# telemetry, ...) side by side.
TRAINSUP_PREBUILT_WHEEL=$(ls "$wheel_dir"/trainsup-*.whl) \
  ctest --test-dir "$build_dir" --output-on-failure --timeout 900 -R '^(install\.pip_wheel|layers\.thread_safety)$' &
wheel_check=$!
tsan_status=0
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan -L core --output-on-failure --timeout 600 || tsan_status=$?
wheel_status=0
wait "$wheel_check" || wheel_status=$?
if ((tsan_status || wheel_status)); then
  echo "test.sh: ThreadSanitizer suites exit $tsan_status, wheel check exit $wheel_status" >&2
  exit 1
fi
