#!/usr/bin/env bash
# Nodes without kubelets (testing/cluster/k8s/fleet) look to the real control plane like GPU nodes:
# Ready, untainted, 8 GPUs and 640 GiB of the memory pool advertised, Leases renewed; the real
# kube-scheduler binds whole-GPU pods itself and memory-sized pods through gpulet's extender.
source "$(dirname "$0")/lib.sh"
cluster_env

say "20 fleet nodes Ready and untainted, with nvidia.com/gpu 8 and gpulet.io/gpu-memory-1gi 640"
n="$(kc get nodes -l gpulet.io/fleet=fleet -o jsonpath='{range .items[*]}{.metadata.name} {.status.allocatable.nvidia\.com/gpu} {.status.capacity.gpulet\.io/gpu-memory-1gi} {.spec.taints}{"\n"}{end}')"
[ "$(echo "$n" | grep -c '^fleet-[0-9]* 8 640 $')" = 20 ] || fail "fleet nodes: $n"
for node in $(kc get nodes -l gpulet.io/fleet=fleet -o name); do
  kc wait --for=condition=Ready "$node" --timeout=30s >/dev/null || fail "$node not Ready"
done
[ "$(kc get configmaps -n gpulet-system -l gpulet.io/memory-pool=true -o name | grep -c gpulet-memory-fleet-)" = 20 ] \
  || fail "not 20 gpulet-memory-fleet-* ConfigMaps"

say "their Leases in kube-node-lease are renewed"
r1="$(kc get lease -n kube-node-lease fleet-00000 -o jsonpath='{.spec.renewTime}')"
renewed() { [ "$(kc get lease -n kube-node-lease fleet-00000 -o jsonpath='{.spec.renewTime}')" != "$r1" ]; }
until_true 60 "lease fleet-00000 renewed (was $r1)" renewed

say "80 whole-GPU pods: the real scheduler binds them all (no extender call: managedResources)"
f0="$(ext_metric gpulet_extender_filter_requests_total)"
out="$("$state/fleet" pods -count 80 -kind gpu -node-selector gpulet.io/fleet=fleet -namespace fleet-gpu -timeout 120s)" \
  || fail "fleet pods (gpu) failed: $out"
echo "$out"
echo "$out" | grep -q '"bound":80,' || fail "not all 80 whole-GPU pods bound: $out"
[ "$(ext_metric gpulet_extender_filter_requests_total)" = "$f0" ] || fail "whole-GPU pods reached the extender"

say "80 pods of 20 GiB (gpulet-memory profile): filtered, scored and bound by the extender"
b0="$(ext_metric 'gpulet_extender_binds_total{result="bound"}')"
p0="$(ext_metric gpulet_extender_prioritize_requests_total)"
out="$("$state/fleet" pods -count 80 -kind memory -amount 20 -scheduler gpulet-memory \
  -node-selector gpulet.io/fleet=fleet -namespace fleet-memory -timeout 120s)" || fail "fleet pods (memory) failed: $out"
echo "$out"
echo "$out" | grep -q '"bound":80,' || fail "not all 80 memory pods bound: $out"
b1="$(ext_metric 'gpulet_extender_binds_total{result="bound"}')"
[ $((b1 - b0)) -ge 80 ] || fail "the extender made $((b1 - b0)) binds for 80 pods"
[ "$(ext_metric gpulet_extender_prioritize_requests_total)" -gt "$p0" ] || fail "no prioritize call reached the extender"
echo PASS
