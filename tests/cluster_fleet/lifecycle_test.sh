#!/usr/bin/env bash
# The fleet's renewed Leases are what keep its nodes schedulable: the "stale" node, whose Lease
# the fleet never renews, is marked unreachable by the real node lifecycle controller after its
# grace period, while at that moment every renewed node is still Ready and untainted.
source "$(dirname "$0")/lib.sh"
cluster_env

say "the node lifecycle controller taints stale-00000 (Lease never renewed) unreachable"
unreachable() { [[ "$(kc get node stale-00000 -o jsonpath='{.spec.taints[*].key}')" == *node.kubernetes.io/unreachable* ]]; }
until_true 180 "stale-00000 tainted node.kubernetes.io/unreachable" unreachable
kc get node stale-00000 -o jsonpath='{.spec.taints}'; echo

say "meanwhile the 22 nodes with renewed Leases are Ready and untainted"
bad="$(kc get nodes -l 'gpulet.io/fleet in (fleet,ext)' -o jsonpath='{range .items[*]}{.metadata.name} {.spec.taints}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -v ' True$' || true)"
[ -z "$bad" ] || fail "renewed nodes not Ready or tainted: $bad"
[ "$(kc get nodes -l 'gpulet.io/fleet in (fleet,ext)' -o name | wc -l)" = 22 ] || fail "not 22 renewed nodes"
echo PASS
