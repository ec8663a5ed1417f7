#!/usr/bin/env bash
# Installs what bench/vs_alternatives.py and bench/checkpoint_vs_alternatives.py compare trainsup
# with, at the versions pinned in bench/requirements.txt, into the project's venv (.venv, made
# by scripts/install-deps.sh). Idempotent. Not part of CI: the comparison is a benchmark.
#
#   bash bench/install-alternatives.sh
#
# NVIDIA Resiliency Extension: its newest release on PyPI (0.7.0) ships wheels for manylinux
# 2.39 (glibc >= 2.39) and CPython 3.12/3.14 only; this platform is Debian 12 (glibc 2.36) with
# CPython 3.11, where pip offers 0.4.1 at most. The release's code is pure Python but for one
# extension, nvrx_cupti_module (the straggler detector's CUPTI hooks, which need a GPU). So the
# release's own wheel is downloaded from PyPI and installed as a pure-Python wheel: its Python
# files are those of the release, byte for byte; the CUPTI module (built for CPython 3.12) is
# inert here, as it would be on any CPU host. Its dependencies come from its own metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "install-alternatives: no .venv here; run scripts/install-deps.sh first" >&2; exit 1; }

NVRX_VERSION=$(sed -n 's/^# nvidia-resiliency-ext==\([0-9.]*\).*/\1/p' bench/requirements.txt)
[ -n "$NVRX_VERSION" ] || { echo "install-alternatives: bench/requirements.txt names no nvidia-resiliency-ext version" >&2; exit 1; }

"$PY" -m pip install -q -r bench/requirements.txt wheel

have=$("$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-resiliency-ext"))' 2>/dev/null || true)
if [ "$have" != "$NVRX_VERSION" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_39_x86_64 --python-version 3.12 \
    -d "$tmp" "nvidia-resiliency-ext==$NVRX_VERSION"
  whl=$(ls "$tmp"/nvidia_resiliency_ext-"$NVRX_VERSION"-*.whl)
  "$PY" -m wheel tags --remove --python-tag py3 --abi-tag none --platform-tag any "$whl" >/dev/null
  "$PY" -m pip install -q "$tmp"/nvidia_resiliency_ext-"$NVRX_VERSION"-py3-none-any.whl
fi
"$PY" - <<'EOF'
import importlib.metadata as m
for name in ("nvidia-resiliency-ext", "torchft", "torch"):
    print(f"{name} {m.version(name)}")
EOF
