#!/usr/bin/env bash
# The GPU path on a real GPU, in one run: builds trainsup against this machine's python3, torch
# and CUDA, then runs scripts/gpu_check.py (NCCL collective tracking, NCCL abort on an abort
# order, NVML preflight and GPU identity, device-to-pinned snapshots) and prints its one JSON
# line. docs/gpu-validation.md says what each check shows and records the runs.
#
#   scripts/gpu-check.sh                  build (into build-gpu/) and check; exit 0 = every check passed,
#                                         1 = a check failed, 3 = no GPU was found (nothing was checked)
#   scripts/gpu-check.sh --fetch-deps     on a machine with apt: download the Debian packages the build
#                                         needs into .gpu-deps/ (for a GPU host without a package registry)
#   scripts/gpu-check.sh --rehearse-cpu   no GPU: run the same harness on the CPU (gloo, a held peer in place
#                                         of a held kernel) to prove the script itself; proves nothing of the GPU
#
# Environment: TRAINSUP_GPU_PYTHON (default python3: the interpreter whose torch is checked),
# TRAINSUP_GPU_BUILD_DIR (default build-gpu), GPU_CHECK_OUT (also write the JSON line and logs
# there; default $OUT when set, as the device tool provides), GPU_CHECK_SNAPSHOT_GIB (default 4),
# GPU_CHECK_USE_DEBS=1 (build against .gpu-deps/ even where the system has the packages).
# The build needs spdlog, fmt, nlohmann-json, Boost headers, xxHash and CLI11: from the system when
# present, else from the .deb files in .gpu-deps/ unpacked into build-gpu/deps (no root needed).
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
py=${TRAINSUP_GPU_PYTHON:-python3}
build=${TRAINSUP_GPU_BUILD_DIR:-build-gpu}
out=${GPU_CHECK_OUT:-${OUT:-}}
mode=gpu
deb_packages=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 nlohmann-json3-dev libboost1.81-dev libxxhash-dev libxxhash0 libcli11-dev)

case "${1:-}" in
  --fetch-deps)
    mkdir -p .gpu-deps
    (cd .gpu-deps && apt-get download "${deb_packages[@]}") || { echo "gpu-check: apt-get download failed" >&2; exit 1; }
    du -sh .gpu-deps
    exit 0 ;;
  --rehearse-cpu) mode=cpu ;;
  "") ;;
  *) echo "gpu-check: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
esac

say() { echo "[gpu-check] $*" >&2; }
t_start=$(date +%s)
[[ -n $out ]] && mkdir -p "$out"

# No GPU: say so plainly (the JSON line too) unless rehearsing on the CPU.
if [[ $mode == gpu ]] && ! "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  why=$("$py" -c 'import torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device")' 2>&1 | tail -1)
  command -v nvidia-smi >/dev/null || why="$why; nvidia-smi not found"
  say "NO GPU FOUND: $why. Nothing of the GPU path was checked (use --rehearse-cpu to prove the script on the CPU)."
  line=$(printf '{"gpu_found": false, "reason": "%s", "passed": false}' "${why//\"/\'}")
  echo "$line"
  [[ -n $out ]] && echo "$line" > "$out/gpu-check.json"
  exit 3
fi

# Build dependencies that are not on this machine come from .gpu-deps/*.deb, unpacked (dpkg -x).
prefix_args=()
ld_extra=""
if [[ ${GPU_CHECK_USE_DEBS:-0} == 1 ]] || ! [[ -f /usr/include/spdlog/spdlog.h && -f /usr/include/nlohmann/json.hpp && -f /usr/include/xxhash.h && -f /usr/include/CLI/CLI.hpp && -d /usr/include/boost/asio ]]; then
  if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then
    say "spdlog/nlohmann-json/boost/xxhash headers are missing and .gpu-deps/ holds no .deb files: run '$0 --fetch-deps' on a machine with apt and carry .gpu-deps"
    exit 2
  fi
  deps=$repo/$build/deps
  if [[ ! -f $deps/.unpacked ]]; then
    mkdir -p "$deps"
    for f in .gpu-deps/*.deb; do dpkg-deb -x "$f" "$deps" || { say "cannot unpack $f"; exit 2; }; done
    touch "$deps/.unpacked"
  fi
  prefix_args=(-DCMAKE_PREFIX_PATH="$deps/usr" -DBoost_ROOT="$deps/usr")
  # Rehearsing the device's case here: nothing may come from this system's /usr.
  [[ ${GPU_CHECK_USE_DEBS:-0} == 1 ]] && prefix_args+=(-DCMAKE_IGNORE_PREFIX_PATH=/usr)
  ld_extra=$deps/usr/lib/x86_64-linux-gnu
  say "build dependencies from .gpu-deps/ (unpacked into $deps)"
fi

# NCCL's header and library from the Python environment's nvidia-nccl wheel, wherever it put them.
nccl_args=()
nccl_h=$("$py" - <<'EOF' 2>/dev/null
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()] + sys.path
for root in roots:
    for h in glob.glob(os.path.join(root, "nvidia", "**", "include", "nccl.h"), recursive=True):
        print(h)
        raise SystemExit
EOF
)
if [[ -n $nccl_h ]]; then
  nccl_inc=$(dirname "$nccl_h")
  nccl_lib=$(ls "$(dirname "$nccl_inc")"/lib/libnccl.so* 2>/dev/null | head -1)
  nccl_args=(-DNCCL_INCLUDE_DIR="$nccl_inc")
  [[ -n $nccl_lib ]] && nccl_args+=(-DNCCL_LIBRARY="$nccl_lib")
fi

# Configure: the CUDA layer is required on a GPU run; the torch layer (tracking) is wanted, and
# if this torch's CMake config cannot be used the build goes on without it and the tracking
# check says so.
layers=(-DTRAINSUP_WITH_PYTHON=ON)
if [[ $mode == gpu ]]; then
  layers+=(-DTRAINSUP_WITH_CUDA=ON)
  # One toolkit for trainsup and torch's CMake config: the system's, not a pip cuda-toolkit's nvcc.
  nvcc=/usr/local/cuda/bin/nvcc
  [[ -x $nvcc ]] || nvcc=$(command -v nvcc || true)
  [[ -n $nvcc ]] && layers+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")")
  say "nvcc: ${nvcc:-NOT FOUND} ($("${nvcc:-false}" --version 2>/dev/null | tail -1))"
  say "Python.h: $("$py" -c 'import os, sysconfig; p = os.path.join(sysconfig.get_paths()["include"], "Python.h"); print(p if os.path.exists(p) else "MISSING at " + p)')"
  say "nccl.h: ${nccl_h:-NOT FOUND: NCCL abort will be built disabled and the abort check will fail}"
fi
common=(-S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$(command -v "$py")"
        -DTRAINSUP_BUILD_TESTS=OFF -DTRAINSUP_BUILD_EXAMPLES=OFF -DTRAINSUP_BUILD_BENCH=OFF
        "${prefix_args[@]}" "${nccl_args[@]}" "${layers[@]}")
command -v ninja >/dev/null && common+=(-G Ninja)
log=${out:-$repo/$build}/gpu-check-build.log
mkdir -p "$build" "$(dirname "$log")"
torch_layer=ON
if ! cmake "${common[@]}" -DTRAINSUP_WITH_TORCH=ON >"$log" 2>&1; then
  say "configure with the torch layer failed (tail of $log below); trying without it"
  tail -15 "$log" >&2
  torch_layer=OFF
  rm -f "$build/CMakeCache.txt"
  if ! cmake "${common[@]}" -DTRAINSUP_WITH_TORCH=OFF >>"$log" 2>&1; then
    say "configure failed:"; tail -30 "$log" >&2; exit 2
  fi
fi
if ! cmake --build "$build" -j"$(nproc)" >>"$log" 2>&1; then
  if [[ $torch_layer == ON ]]; then
    # The torch layer (tracking backend) has been compiled against other torch headers than
    # this one's: keep what can still be checked (nvml, snapshot) rather than nothing.
    say "build with the torch layer failed (errors below); building without it"
    grep -E "error|Error" "$log" | head -20 >&2
    torch_layer=OFF
    rm -f "$build/CMakeCache.txt"
    if ! { cmake "${common[@]}" -DTRAINSUP_WITH_TORCH=OFF && cmake --build "$build" -j"$(nproc)"; } >>"$log" 2>&1; then
      say "build failed:"; tail -30 "$log" >&2; exit 2
    fi
  else
    say "build failed:"; tail -30 "$log" >&2; exit 2
  fi
fi
t_built=$(date +%s)
say "built in $((t_built - t_start)) s (torch layer $torch_layer)"

export PYTHONPATH=$repo/$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}
[[ -n $ld_extra ]] && export LD_LIBRARY_PATH=$ld_extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
args=(--build-seconds "$((t_built - t_start))")
[[ $mode == cpu ]] && args+=(--rehearse-cpu)
[[ -n $out ]] && args+=(--out "$out")
exec "$py" scripts/gpu_check.py "${args[@]}"
