#!/usr/bin/env bash
# The Go tests of the cluster tiers' own tools (testing/cluster/k8s: the fleet tool's slice and
# claim templates), with testing/cluster/build.sh's module and build caches (keyed outside the
# clone). Needs Go >= 1.26; skipped without it (77), except under CI=true.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
export PATH=/usr/local/go/bin:$PATH
if ! command -v go >/dev/null; then
  [ "${CI:-}" = true ] && { echo "fleet tool tests: no Go toolchain (CI=true: failing, not skipping)" >&2; exit 1; }
  echo "fleet tool tests skipped: no Go toolchain" >&2; exit 77
fi
cache="${GPULET_CLUSTER_CACHE:-$([ "$(id -u)" = 0 ] && echo /var/cache/gpulet-cluster || echo "${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-cluster")}"
mkdir -p "$cache"
export GOTOOLCHAIN=local GOFLAGS="-mod=mod" CGO_ENABLED=0 GOMODCACHE="$cache/mod" GOCACHE="$cache/gocache"
cd "$repo/testing/cluster/k8s"
go test -count=1 ./fleet/
