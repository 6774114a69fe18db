#!/usr/bin/env bash
# The device plugin on the real cluster (issue 32, items 3-5): gpulet deployed from its own
# manifests (kubectl apply -k), the real kubelet's capacity and Allocate, containerd creating what
# Allocate named, the scheduler's refusals, health from an XID, and kubelet and agent restarts.
source "$(dirname "$0")/lib.sh"
overlay="$repo/testing/cluster/overlays/sim-dgx-h100"
ns=gpulet-test-dp

kc delete -k "$overlay" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
fresh_namespace "$ns"

say "without the agent: no nvidia.com/gpu, and a pod asking for one stays Pending with the scheduler's reason"
# A fresh node has no nvidia.com/gpu at all; after an agent went away the real kubelet keeps the
# resource in capacity with allocatable 0 (until it restarts). Either way nothing is allocatable.
no_gpus() { allocatable_is "" || allocatable_is 0; }
until_true 60 "node without allocatable nvidia.com/gpu" no_gpus
gpu_pod "$ns" gpu-0 1
until_true 60 "FailedScheduling 'Insufficient nvidia.com/gpu' for gpu-0" scheduler_said "$ns" gpu-0 "Insufficient nvidia.com/gpu"
pod_phase_is "$ns" gpu-0 Pending || fail "gpu-0 not Pending without the agent"

say "gpulet doctor on the node says why"
doctor="$("$build/gpulet" --simulate dgx-h100 doctor --device-plugin-path /var/lib/kubelet/device-plugins 2>&1 || true)"
grep -q "no gpulet resource socket" <<< "$doctor" || fail "doctor did not name the missing plugin: $doctor"

say "deploy: kubectl apply -k (the shipped base, on the simulated DGX H100)"
kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
kc apply -k "$overlay" >/dev/null
t0=$SECONDS
kc -n gpulet-system rollout status daemonset/gpulet --timeout=180s >/dev/null || fail "gpulet DaemonSet not ready"
until_true 60 "capacity nvidia.com/gpu: 8" capacity_is 8
until_true 30 "allocatable nvidia.com/gpu: 8" allocatable_is 8
echo "agent ready and capacity 8 in $((SECONDS - t0)) s"

say "eight pods of one GPU each run, each seeing exactly its GPU"
for i in 1 2 3 4 5 6 7; do gpu_pod "$ns" "gpu-$i" 1; done
for i in 0 1 2 3 4 5 6 7; do
  until_true 120 "gpu-$i Running" pod_phase_is "$ns" "gpu-$i" Running
done
declare -A seen_uuid seen_dev
for i in 0 1 2 3 4 5 6 7; do
  until_true 30 "gpu-$i printed its /dev" logs_have "$ns" "gpu-$i" '^DEV:'
  out="$(kc logs -n "$ns" "gpu-$i")"
  uuid="$(echo "$out" | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')"
  [[ "$uuid" =~ ^GPU-[0-9a-f-]+$ ]] || fail "gpu-$i: NVIDIA_VISIBLE_DEVICES is '$uuid', want one GPU UUID"
  [ -z "${seen_uuid[$uuid]:-}" ] || fail "gpu-$i and ${seen_uuid[$uuid]} got the same GPU $uuid"
  seen_uuid[$uuid]="gpu-$i"
  devs="$(echo "$out" | sed -n '/^DEV:/,$p' | grep -E '^nvidia[0-9]+$' || true)"
  [ "$(echo "$devs" | grep -c .)" = 1 ] || fail "gpu-$i sees device nodes '$devs', want exactly one"
  [ -z "${seen_dev[$devs]:-}" ] || fail "gpu-$i and ${seen_dev[$devs]} got the same device node $devs"
  seen_dev[$devs]="gpu-$i"
  grep -qx nvidiactl <<< "$out" || fail "gpu-$i lacks /dev/nvidiactl"
  echo "gpu-$i: $uuid /dev/$devs"
done

say "the ninth is Pending with the scheduler's reason"
gpu_pod "$ns" gpu-8 1
until_true 60 "FailedScheduling for gpu-8" scheduler_said "$ns" gpu-8 "Insufficient nvidia.com/gpu"
pod_phase_is "$ns" gpu-8 Pending || fail "gpu-8 not Pending on a full node"
kc delete pod -n "$ns" gpu-8 --wait=false >/dev/null

containers() { kc get pods -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].containerID}/{.status.containerStatuses[0].restartCount} {end}'; }
before="$(containers)"

say "health: XID 79 on GPU 3 drops allocatable to 7; recovery brings it back to 8"
kc exec -n gpulet-system "$(agent_pod)" -c gpulet -- gpulet sim xid --gpu 3 --code 79 >/dev/null \
  || fail "gpulet sim xid in the agent's pod failed"
until_true 30 "allocatable 7 after XID 79" allocatable_is 7
capacity_is 8 || fail "capacity changed after an XID: $(node_field '.status.capacity.nvidia\.com/gpu')"
until_true 90 "allocatable 8 after the quiet period" allocatable_is 8

say "kubelet restart: the plugin registers again on the new kubelet.sock, no running pod is disturbed"
# gpulet's own "event=registered" lines, read from its container's log file on the node.
registrations() { cat /var/log/pods/gpulet-system_gpulet-*/gpulet/*.log 2>/dev/null | grep -c 'event=registered' || true; }
n0="$(registrations)"
[ "$n0" -ge 1 ] || fail "no registration in the agent's log"
"$repo/testing/cluster/cluster.sh" restart kubelet
t0=$(date +%s%N)
until_true 60 "kubelet healthy again" curl -sf http://127.0.0.1:10248/healthz
t1=$(date +%s%N)
registered_again() { [ "$(registrations)" -gt "$n0" ]; }
until_true 30 "gpulet registered with the restarted kubelet" registered_again
t2=$(date +%s%N)
until_true 60 "allocatable 8 after the kubelet restart" allocatable_is 8
echo "kubelet restarted: healthy after $(( (t1 - t0) / 1000000 )) ms, gpulet registered $(( (t2 - t1) / 1000000 )) ms later"
[ "$(containers)" = "$before" ] || fail "pods disturbed by the kubelet restart: before '$before' after '$(containers)'"

say "agent restart: the DaemonSet's new pod re-registers, no running pod disturbed"
old="$(agent_pod)"
kc delete pod -n gpulet-system "$old" --wait=true --timeout=60s >/dev/null
kc -n gpulet-system rollout status daemonset/gpulet --timeout=120s >/dev/null || fail "agent not back"
until_true 60 "a new agent pod Ready" agent_ready
until_true 60 "allocatable 8 after the agent restart" allocatable_is 8
[ "$(containers)" = "$before" ] || fail "pods disturbed by the agent restart"

kc delete namespace "$ns" --wait=false >/dev/null
echo PASS
