#!/usr/bin/env bash
# The fleet tier's CTest fixture. `run_fixture.sh up` brings up cluster instance 1 (control plane
# only, API on 127.0.0.1:6453) with gpulet's extender in its kube-scheduler as deploy/extender
# ships it (lib.sh, fleet_cluster_up), then three fleets of Node objects without kubelets
# (testing/cluster/k8s/fleet): "fleet" (20 nodes of 8 GPUs, all in the memory pool), "ext" (2 nodes
# of 2 GPUs of 80 GiB) and "stale" (1 node whose Lease is never renewed: the control for the node
# lifecycle controller). `run_fixture.sh down` stops them, takes instance 1 down and checks that
# nothing is left. Without root or Go the tier is skipped (77), except under CI=true.
source "$(dirname "$0")/lib.sh"
missing() {
  if [ "${CI:-}" = true ]; then echo "fleet tier: $1 (CI=true: failing, not skipping)" >&2; exit 1; fi
  echo "fleet tier skipped: $1" >&2; exit 77
}

up() {
  [ "$(id -u)" = 0 ] || missing "needs root"
  command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || missing "no Go toolchain (>= 1.26)"
  fleet_cluster_up "${GPULET_BUILD_DIR:?GPULET_BUILD_DIR (the build directory) is not set}"
  start_bg fleet "$state/fleet" nodes -count 20 -prefix fleet- -ready-file "$state/fleet.ready"
  start_bg fleet-ext "$state/fleet" nodes -count 2 -prefix ext- -gpus 2 -memory-gpus 2 -ready-file "$state/ext.ready"
  start_bg fleet-stale "$state/fleet" nodes -count 1 -prefix stale- -memory-gpus 0 -lease-renew 0 \
    -ready-file "$state/stale.ready"
  wait_file 180 "$state/fleet.ready" fleet
  wait_file 180 "$state/ext.ready" fleet-ext
  wait_file 180 "$state/stale.ready" fleet-stale
  echo "fleet tier up: instance $GPULET_CLUSTER_INSTANCE at $GPULET_CLUSTER_API, 23 fleet nodes, extender on 127.0.0.1:$ext_port"
}

down() {
  [ "$(id -u)" = 0 ] || missing "needs root"
  set +e
  fleet_cluster_down || exit 1
  local left
  left="$(leftovers "/var/lib/gpulet-k8s-$GPULET_CLUSTER_INSTANCE" "/run/gpulet-k8s-$GPULET_CLUSTER_INSTANCE" "$state")"
  [ -z "$left" ] || { echo "teardown left:$left" >&2; exit 1; }
  echo "fleet teardown: nothing left"
}

case "${1:-}" in
  up) up;;
  down) down;;
  *) echo "usage: run_fixture.sh up|down" >&2; exit 2;;
esac
