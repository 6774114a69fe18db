#!/usr/bin/env bash
# What the real kube-scheduler's structured-parameters allocator admits from gpulet's slices
# (issue 33, item 2), each claim pinned to GPU 0 by its UUID attribute:
# - 20 GiB memory shares (the shipped gpu-memory.gpulet.io class; capacity with a request policy):
#   as many as the share device's capacity holds (79 GiB on the simulated H100 80GB, whose 81,559
#   MiB is not 80 GiB: three), the next Pending with the scheduler's reason;
# - partitionable devices (shared counters): a MIG device of GPU 0 is never allocated while the
#   whole GPU 0 is, nor the whole GPU while a MIG device of it is; a freed GPU is used again.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-dra-sched
finish() {
  kc delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  undeploy_dra
}
trap finish EXIT

fresh_namespace "$ns"
deploy_dra
uuid0() {
  kc get resourceslices --field-selector "spec.nodeName=$node" -o json | python3 -c '
import json, sys
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"].get("devices", []):
        if d["name"] == "gpu-0":
            print(d["attributes"]["uuid"]["string"])'
}
until_true 60 "GPU 0 published" test -n "$(uuid0)"
gpu0="$(uuid0)"

on_gpu0="device.attributes[\"gpu.gpulet.io\"].uuid == \"$gpu0\""
mig_of_gpu0="device.attributes[\"gpu.gpulet.io\"].parentUUID == \"$gpu0\""
pending_for() {  # pending_for POD: Pending, and the scheduler said why
  pod_phase_is "$ns" "$1" Pending && scheduler_said "$ns" "$1" "cannot allocate all claims"
}
gone() { ! kc get pod -n "$ns" "$1" >/dev/null 2>&1; }
drop() {  # drop NAME...: the pods and their claims, gone
  local n
  for n in "$@"; do kc delete pod -n "$ns" "$n" --wait=false >/dev/null; done
  for n in "$@"; do until_true 60 "$n deleted" gone "$n"; kc delete resourceclaim -n "$ns" "$n" >/dev/null; done
}

say "20 GiB memory shares of GPU 0: three fit its 79 GiB, the fourth is Pending"
for i in 1 2 3; do pinned_claim_pod "$ns" "share-$i" gpu-memory.gpulet.io "$on_gpu0" 20Gi; done
for i in 1 2 3; do until_true 120 "share-$i Running" pod_phase_is "$ns" "share-$i" Running; done
pinned_claim_pod "$ns" share-4 gpu-memory.gpulet.io "$on_gpu0" 20Gi
until_true 60 "share-4 Pending with the scheduler's reason" pending_for share-4
echo "share-4: $(kc get events -n "$ns" --field-selector involvedObject.name=share-4,reason=FailedScheduling -o jsonpath='{.items[-1:].message}')"
drop share-1 share-2 share-3 share-4

say "whole GPU 0 allocated: no MIG device of it can be"
pinned_claim_pod "$ns" whole gpu.gpulet.io "$on_gpu0"
until_true 120 "whole Running" pod_phase_is "$ns" whole Running
pinned_claim_pod "$ns" mig mig.gpulet.io "$mig_of_gpu0"
until_true 60 "mig Pending with the scheduler's reason" pending_for mig
say "whole GPU 0 freed: the MIG device is allocated; now the whole GPU cannot be"
drop whole
until_true 120 "mig Running once GPU 0 is free" pod_phase_is "$ns" mig Running
pinned_claim_pod "$ns" whole-again gpu.gpulet.io "$on_gpu0"
until_true 60 "whole-again Pending while a MIG device of GPU 0 is allocated" pending_for whole-again
drop mig
until_true 120 "whole-again Running once the MIG device is freed" pod_phase_is "$ns" whole-again Running
drop whole-again
echo PASS
