#!/usr/bin/env bash
# Installs what trainsup needs to build, test and run its demo, idempotently:
#   1. Debian packages with apt (only the missing ones; `apt-get update` only then);
#   2. a virtual environment, ${TRAINSUP_VENV:-.venv} in the repository, with the packages of
#      requirements-dev.txt from PyPI (torch 2.13.0 CPU, pytest, ...); pip runs only when that
#      file changed since the last install.
# Runs as root (or with sudo available). CUDA is optional and not installed here: the build
# uses /usr/local/cuda when it exists. Prints the venv's python path as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential pkg-config              # toolchain (cmake and ninja come from PyPI)
  libspdlog-dev libfmt-dev                # logs (spdlog)
  nlohmann-json3-dev                      # event log, checkpoint index (JSON)
  libxxhash-dev                           # checkpoint checksums (XXH3)
  libboost-dev                            # Boost.Asio: telemetry to the job coordinator
  libgtest-dev libgmock-dev               # C++ tests
  clang                                   # thread-safety analysis (ctest layers.thread_safety), fuzzing
  libcli11-dev                            # example trainer flags
  python3 python3-dev python3-venv        # the interpreter the venv is made from
  etcd-server                             # the etcd-v2 rendezvous: a store that outlives any host
  iproute2 iptables                       # network faults between simulated hosts (namespaces, loss)
  libnetfilter-queue-dev                  # ...and delay without netem (NetfilterQueue builds on it)
  strace                                  # crash points of the DCP checkpoint path (fault injection)
  slurmctld slurmd slurm-client munge     # a Slurm cluster the suite starts (tests/python/slurm_cluster.py)
  prometheus                              # scrapes the agents' /metrics (tests/python/test_launcher.py)
  chromium                                # renders the report at scale (tests/python/test_report_scale.py)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >&2
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
else
  echo "install-deps: all ${#packages[@]} Debian packages present" >&2
fi

# The venv is made from the python3 on PATH (CPython 3.11 here: the torch wheel's ABI).
venv=${TRAINSUP_VENV:-$PWD/.venv}
if [[ ! -x $venv/bin/python ]]; then
  echo "install-deps: creating the virtual environment $venv" >&2
  python3 -m venv "$venv" >&2
fi
stamp=$venv/.trainsup-requirements
if ! cmp -s requirements-dev.txt "$stamp"; then
  echo "install-deps: pip install -r requirements-dev.txt into $venv" >&2
  # (pip warns about every index location missing on this machine: noise, filtered)
  "$venv/bin/python" -m pip install -q -r requirements-dev.txt > "$venv/pip-install.log" 2>&1 \
    || { grep -v "^WARNING: Location" "$venv/pip-install.log" >&2; exit 1; }
  cp requirements-dev.txt "$stamp"
else
  echo "install-deps: $venv is up to date with requirements-dev.txt" >&2
fi
echo "$venv/bin/python"
