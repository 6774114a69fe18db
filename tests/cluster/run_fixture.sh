#!/usr/bin/env bash
# The cluster tier's CTest fixture: `run_fixture.sh up` brings the real cluster up (building the
# upstream components first if the cache lacks them), `run_fixture.sh down` takes it down and checks
# that nothing is left. Without root, or on a machine that cannot build the components, the tier
# is skipped (exit 77), except under CI=true, where a missing prerequisite fails the run.
set -uo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
missing() {
  if [ "${CI:-}" = true ]; then echo "cluster tier: $1 (CI=true: failing, not skipping)" >&2; exit 1; fi
  echo "cluster tier skipped: $1" >&2; exit 77
}
case "${1:-}" in
  up)
    [ "$(id -u)" = 0 ] || missing "needs root"
    command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || missing "no Go toolchain (>= 1.26)"
    exec "$repo/testing/cluster/cluster.sh" up --build "${GPULET_BUILD_DIR:?}"
    ;;
  down)
    [ "$(id -u)" = 0 ] || missing "needs root"
    "$repo/testing/cluster/cluster.sh" down || exit 1
    left=""
    # This cluster's processes name its directories (a control-plane-only instance beside it, with
    # directories of its own, is not this fixture's).
    pgrep -f '(/var/lib/gpulet-k8s|/run/gpulet-k8s)/' >/dev/null && left="$left processes;"
    grep -qE ' (/run/gpulet-k8s|/var/lib/gpulet-k8s|/var/lib/kubelet)' /proc/self/mountinfo && left="$left mounts;"
    ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && left="$left cgroups;"
    ip link show cni0 >/dev/null 2>&1 && left="$left cni0;"
    [ -e /var/lib/gpulet-k8s ] || [ -e /run/gpulet-k8s ] && left="$left files;"
    [ -z "$left" ] || { echo "teardown left:$left" >&2; exit 1; }
    echo "teardown: nothing left"
    ;;
  *) echo "usage: run_fixture.sh up|down" >&2; exit 2;;
esac
