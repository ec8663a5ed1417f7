#!/usr/bin/env bash
# `pip wheel .` as a user runs it (build isolation included: the build finds the torch of the
# environment it installs into, not one of its own), then the wheel installed into the
# environment and used from a clean directory with no PYTHONPATH: `import trainsup`, the
# trainsup and trainsup-run commands, and a C++ consumer linking trainsup::torch through
# trainsup.cmake_prefix_path. Uninstalls the wheel at the end.
#   check_wheel.sh PYTHON SOURCE_DIR WORK_DIR CONSUMER_DIR
# TRAINSUP_PREBUILT_WHEEL=path: check that wheel (built the same way) instead of building one.
set -euo pipefail
py=$1 src=$2 work=$3 consumer=$4
bin=$(dirname "$py")
rm -rf "$work"
mkdir -p "$work"
trap '"$py" -m pip uninstall -q -y trainsup >/dev/null 2>&1 || true' EXIT
unset PYTHONPATH TRAINSUP_PYTHONPATH

if [[ -n ${TRAINSUP_PREBUILT_WHEEL:-} ]]; then
  # scripts/test.sh built it in the background with the command below, beside the other tests.
  whl=$TRAINSUP_PREBUILT_WHEEL
  echo "== the wheel scripts/test.sh built with 'pip wheel --no-deps $src': $whl"
else
  echo "== pip wheel $src"
  "$py" -m pip wheel -q --no-deps -w "$work/dist" "$src" 2>&1 | grep -v "^WARNING: Location" || true
  whl=$(ls "$work"/dist/trainsup-*.whl)
  echo "built $whl"
fi
"$py" - "$whl" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["trainsup/__init__.py", "trainsup/_build_info.py", "trainsup/run.py", "trainsup/launch/launcher.py",
        "trainsup/launch/run.py", "trainsup/tools/cli.py", "trainsup/tools/report.py", "trainsup/include/trainsup/supervisor.h",
        "trainsup/include/trainsup/tracking_backend.h", "trainsup/include/trainsup/coordinator.h",
        "trainsup/lib/cmake/trainsup/trainsupConfig.cmake"]
prefixes = ["trainsup/_trainsup.cpython", "trainsup/_trainsup_torch.cpython", "trainsup/lib/libtrainsup.so", "trainsup/lib/libtrainsup_agent.so",
            "trainsup/lib/libtrainsup_torch.so"]
missing = [n for n in need if n not in names] + [p for p in prefixes if not any(n.startswith(p) for n in names)]
entry = [n for n in names if n.endswith("entry_points.txt")]
assert not missing, f"the wheel lacks {missing}"
text = zipfile.ZipFile(sys.argv[1]).read(entry[0]).decode()
assert "trainsup-run = trainsup.launch.run:main" in text and "trainsup = trainsup.tools.cli:main" in text, text
print("wheel contents ok:", len(names), "files")
PY

echo "== pip install the wheel, use it from $work with no PYTHONPATH"
"$py" -m pip install -q --no-deps --force-reinstall "$whl" 2>&1 | grep -v "^WARNING: Location" || true
cd "$work"
"$py" - <<'PY'
import os, sysconfig, torch, torch.distributed as dist
import trainsup
site = sysconfig.get_paths()["platlib"]
assert trainsup.__file__.startswith(site), (trainsup.__file__, site)
assert trainsup.distributed.tracking_available()
assert os.path.isfile(os.path.join(trainsup.cmake_prefix_path, "trainsup", "trainsupConfig.cmake"))
print("import ok:", trainsup.__version__, trainsup.__file__, "torch", torch.__version__)
PY
"$bin/trainsup-run" --help > "$work/run-help.txt"
grep -q -- "--nproc_per_node" "$work/run-help.txt"
"$bin/trainsup" quarantine exclude-arg --dir "$work/quarantine"
echo "commands ok"

echo "== find_package(trainsup) from the wheel: a C++ consumer"
prefix=$("$py" -c 'import trainsup, torch.utils; print(trainsup.cmake_prefix_path + ";" + torch.utils.cmake_prefix_path)')
cmake -S "$consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DTRAINSUP_CONSUMER_TORCH=ON > "$work/consumer.log"
cmake --build "$work/consumer" >> "$work/consumer.log"
TRAINSUP_LOG_DIR="$work/logs" TRAINSUP_NODE_NAME=wheel-host "$work/consumer/consumer"
"$work/consumer/consumer_torch"
ls "$work"/logs/*wheel-host-r0.log > /dev/null
echo "wheel check OK"
