#!/usr/bin/env bash
# The differential tier's CTest fixture: `run_fixture.sh up` brings up cluster instance 3 (control
# plane only: etcd, kube-apiserver, controller-manager, scheduler; API on 127.0.0.1:6473),
# `run_fixture.sh down` takes it down and checks that nothing is left. Without root or Go the tier
# is skipped (77), except under CI=true, where a missing prerequisite fails.
source "$(dirname "$0")/lib.sh"
source "$repo/tests/cluster/common.sh"

up() {
  [ "$(id -u)" = 0 ] || missing "needs root"
  command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || missing "no Go toolchain (>= 1.26)"
  "$repo/testing/cluster/cluster.sh" up --no-node
}

down() {
  [ "$(id -u)" = 0 ] || missing "needs root"
  "$repo/testing/cluster/cluster.sh" down || exit 1
  local left
  left="$(leftovers /var/lib/gpulet-k8s-3 /run/gpulet-k8s-3)"
  [ -z "$left" ] || { echo "teardown left:$left" >&2; exit 1; }
  echo "differential teardown: nothing left"
}

case "${1:-}" in
  up) up;;
  down) down;;
  *) echo "usage: run_fixture.sh up|down" >&2; exit 2;;
esac
