#!/usr/bin/env bash
# Issue 23's Kubernetes check, outside CI: builds (once) kube-apiserver, kube-scheduler and
# kube-controller-manager from Debian's `kubernetes` source package into a cache outside the
# repository (scripts/k8s-build.sh, ~7 minutes the first time), then runs ctest's
# python.kubernetes (tests/python/test_kubernetes.py) against them: the examples' RBAC and Job
# manifests applied to a real API server with RBAC on, a trainsup job whose agents cordon and
# taint the quarantined node, the Job's replacement pod kept off it. Needs the project built
# (scripts/install-deps.sh, scripts/build.sh; the test command does both). Exit status: the test's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >/dev/null
scripts/build.sh >/dev/null
bin_dir=$(scripts/k8s-build.sh | tail -1)
build_dir=${TRAINSUP_BUILD_DIR:-build}
echo "k8s-check: servers in $bin_dir" >&2
TRAINSUP_K8S_BIN=$bin_dir exec ctest --test-dir "$build_dir" -R '^python\.kubernetes$' --output-on-failure -V
