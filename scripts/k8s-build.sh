#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler and kube-controller-manager from Debian's `kubernetes`
# source package into a cache outside the repository, for scripts/k8s-check.sh.
#
# Contract: idempotent; prints the cache's bin directory on its last line of stdout. The cache is
# keyed by the source package's version: $TRAINSUP_K8S_CACHE (default /var/cache/trainsup)/
# k8s-<version>/bin/{kube-apiserver,kube-scheduler,kube-controller-manager}. When the three
# binaries are there already nothing is installed or built. Needs root (apt) the first time and
# about 6-7 minutes of a 2-core machine.
#
# Why from source: Debian 12 packages only the client (kubectl 1.20) of its kubernetes source;
# the servers are in the source package and build with its vendored tree, given:
#  - a deb-src entry (this image's sources are deb822 files with `Types: deb` only), rsync;
#  - `make WHAT=cmd/...` (plain `go build` misses the generated files);
#  - the vendored github.com/modern-go/reflect2 1.0.1 crashes under Go >= 1.18 (Debian 12 has
#    1.19): Debian's golang-github-modern-go-reflect2-dev 1.0.2 replaces it.
set -euo pipefail

cache_root=${TRAINSUP_K8S_CACHE:-/var/cache/trainsup}
log() { echo "k8s-build: $*" >&2; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# deb-src for the image's deb822 sources, in a file of our own (the original is left alone).
src_list=/etc/apt/sources.list.d/trainsup-deb-src.sources
if [ ! -f "$src_list" ]; then
  log "adding deb-src entries ($src_list)"
  sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources | as_root tee "$src_list" >/dev/null
  as_root apt-get update -qq >&2
fi

version=$(apt-cache showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2; exit}')
if [ -z "$version" ]; then
  echo "k8s-build: apt knows no source package 'kubernetes' (deb-src entries in $src_list?)" >&2
  exit 1
fi
dest="$cache_root/k8s-${version}"
bins=(kube-apiserver kube-scheduler kube-controller-manager)
have_all=1
for b in "${bins[@]}"; do [ -x "$dest/bin/$b" ] || have_all=0; done
if [ "$have_all" = 1 ]; then
  log "cached: $dest/bin"
  echo "$dest/bin"
  exit 0
fi

log "installing build dependencies"
DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
  dpkg-dev golang-go rsync make golang-github-modern-go-reflect2-dev >&2

work="$cache_root/build-${version}"
as_root mkdir -p "$work" "$dest/bin"
cd "$work"
if [ ! -d src ]; then
  log "fetching the source package kubernetes $version"
  rm -rf fetch && mkdir fetch
  (cd fetch && apt-get source --download-only "kubernetes=$version" >&2 \
     && dpkg-source -x --no-check ./*.dsc ../src >&2)
fi

reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
if [ ! -f src/vendor/github.com/modern-go/reflect2/.trainsup-replaced ]; then
  log "replacing the vendored reflect2 with Debian's $(ls -d $reflect2)"
  rm -rf src/vendor/github.com/modern-go/reflect2
  mkdir -p src/vendor/github.com/modern-go/reflect2
  cp -r "$reflect2"/. src/vendor/github.com/modern-go/reflect2/
  touch src/vendor/github.com/modern-go/reflect2/.trainsup-replaced
fi

log "building ${bins[*]} (several minutes)"
start=$(date +%s)
what=""
for b in "${bins[@]}"; do what="$what cmd/$b"; done
(cd src && GOFLAGS=-mod=vendor GOCACHE="$work/gocache" GOPATH="$work/gopath" \
   make WHAT="${what# }" KUBE_BUILD_PLATFORMS=linux/amd64 >&2)
for b in "${bins[@]}"; do
  f=$(find src/_output -type f -name "$b" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "k8s-build: $b was not built (see the make output above)" >&2; exit 1; }
  cp "$f" "$dest/bin/$b"
done
log "built in $(( $(date +%s) - start )) s: $dest/bin"
echo "$dest/bin"
