#!/usr/bin/env bash
# Sharing on the real cluster (issue 32, item 6): the node's `nvidia.com/device-plugin.config`
# label switches the deployed agent to the shipped ConfigMap's time-slicing config (4 replicas):
# 32 schedulable, nine one-GPU pods run and two of them share a GPU; the label removed, back to 8.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-sharing
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
until_true 120 "the agent pod Ready" agent_ready
fresh_namespace "$ns"

say "label the node for time-slicing: 32 schedulable"
kc label node "$node" nvidia.com/device-plugin.config=time-slicing --overwrite >/dev/null
until_true 90 "allocatable nvidia.com/gpu: 32" allocatable_is 32
for i in 0 1 2 3 4 5 6 7 8; do gpu_pod "$ns" "s-$i" 1; done
declare -A holder
shared=""
for i in 0 1 2 3 4 5 6 7 8; do
  until_true 120 "s-$i Running" pod_phase_is "$ns" "s-$i" Running
  until_true 30 "s-$i printed its environment" logs_have "$ns" "s-$i" '^DEV:'
  uuid="$(kc logs -n "$ns" "s-$i" | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')"
  [[ "$uuid" =~ ^GPU-[0-9a-f-]+$ ]] || fail "s-$i: NVIDIA_VISIBLE_DEVICES is '$uuid', want one GPU UUID"
  [ -n "${holder[$uuid]:-}" ] && shared="s-$i shares $uuid with ${holder[$uuid]}"
  holder[$uuid]="${holder[$uuid]:-} s-$i"
done
[ -n "$shared" ] || fail "nine pods on eight GPUs, and none shares one"
echo "nine pods running; $shared"

say "label removed: whole GPUs again"
kc delete namespace "$ns" --wait=true --timeout=120s >/dev/null
kc label node "$node" nvidia.com/device-plugin.config- >/dev/null
until_true 90 "allocatable nvidia.com/gpu: 8" allocatable_is 8
echo PASS
