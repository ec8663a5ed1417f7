#!/usr/bin/env bash
# Fuzzes what trainsup reads from outside: the telemetry frame decoder (every byte a peer sends
# a coordinator or node monitor) and a checkpoint's manifest and shard index (the restore path),
# with clang's libFuzzer, AddressSanitizer and UBSan.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      default 120; targets run one after the other
#
# Installs clang and its runtime (apt, idempotent), builds into ${TRAINSUP_FUZZ_BUILD_DIR:-build-fuzz}
# (library and fuzz targets only), writes the seed corpora (fuzz/seeds.h), runs each target over
# a corpus kept in the build directory, and prints one line per target and a JSON line.
# A crash is saved under <build>/crashes/<target>/ and fails the run: add the input to
# fuzz/regressions/<target>/ (the replay test in tests/core/fuzz_replay_test.cc runs every file
# there in the normal build) with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
build=${TRAINSUP_FUZZ_BUILD_DIR:-build-fuzz}
venv=${TRAINSUP_VENV:-$PWD/.venv}
cmake_bin=cmake
[[ -x $venv/bin/cmake ]] && cmake_bin=$venv/bin/cmake
ninja_args=()
[[ -x $venv/bin/ninja ]] && ninja_args=(-G Ninja -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja")

if ! clang++ -fsanitize=fuzzer -x c++ - -o /dev/null >/dev/null 2>&1 <<<'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'; then
  echo "fuzz: installing clang and libFuzzer's runtime (apt)" >&2
  apt-get install -y -q clang libclang-rt-dev >/dev/null 2>&1 || apt-get install -y -q clang libclang-rt-14-dev >/dev/null
fi

"$cmake_bin" -S . -B "$build" "${ninja_args[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_SHARED_LIBS=OFF -DTRAINSUP_SANITIZE=address -DTRAINSUP_BUILD_FUZZERS=ON \
  -DTRAINSUP_BUILD_TESTS=OFF -DTRAINSUP_BUILD_EXAMPLES=OFF -DTRAINSUP_BUILD_BENCH=OFF \
  -DTRAINSUP_WITH_PYTHON=OFF -DTRAINSUP_WITH_TORCH=OFF -DTRAINSUP_WITH_CUDA=OFF >/dev/null
"$cmake_bin" --build "$build" -j"$(nproc)" --target trainsup_fuzz_telemetry_frame trainsup_fuzz_checkpoint trainsup_fuzz_seeds

"$build/fuzz/trainsup_fuzz_seeds" "$build/seeds" >/dev/null
summary="{"
failed=0
for target in telemetry_frame checkpoint; do
  corpus=$build/corpus/$target
  crashes=$build/crashes/$target
  mkdir -p "$corpus" "$crashes" "fuzz/regressions/$target"
  log=$build/fuzz-$target.log
  set +e
  # -max_len: a frame's header and a few records; a manifest and a small shard.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$build/fuzz/trainsup_fuzz_$target" "$corpus" "$build/seeds/$target" fuzz/regressions/$target \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  units=$(ls "$corpus" | wc -l)
  found=$(ls "$crashes" | wc -l)
  echo "fuzz $target: ${seconds} s, ${execs:-?} inputs (${rate:-?}/s), coverage ${cov:-?} edges ${ft:-?} features, corpus $units, crashes $found (exit $rc; log $log)"
  if [[ $rc -ne 0 || $found -ne 0 ]]; then
    failed=1
    grep -E "ERROR|invariant|SUMMARY|Test unit written" "$log" | head -10 >&2 || true
  fi
  summary+="\"$target\": {\"seconds\": $seconds, \"inputs\": ${execs:-0}, \"per_s\": ${rate:-0}, \"edges\": ${cov:-0}, \"crashes\": $found}, "
done
echo "${summary%, }}"
exit $failed
