#!/usr/bin/env bash
# Installs, with apt, the Debian packages trainsup needs to build, test and run its demo.
# Idempotent: installs only what is missing, and runs `apt-get update` only then.
# Runs as root (or with sudo available). CUDA is optional and not installed here: the build
# uses /usr/local/cuda when it exists.
set -euo pipefail

packages=(
  build-essential cmake pkg-config        # toolchain
  libspdlog-dev libfmt-dev                # logs (spdlog)
  nlohmann-json3-dev                      # event log, checkpoint index (JSON)
  libxxhash-dev                           # checkpoint checksums (XXH3)
  libboost-dev                            # Boost.Asio: telemetry to the job coordinator
  libgtest-dev libgmock-dev               # C++ tests
  libcli11-dev                            # example trainer flags
  libtorch-dev libgloo-dev                # libtorch for the example trainer and torch layer
  python3 python3-dev pybind11-dev        # Python bindings
  python3-torch python3-numpy python3-pytest python3-yaml   # yaml: the Kubernetes example check
  etcd-server python3-etcd                # the etcd-v2 rendezvous: a store that outlives any host
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
