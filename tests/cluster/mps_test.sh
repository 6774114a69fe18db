#!/usr/bin/env bash
# MPS on the real cluster (issue 32, item 6): deploy/overlays/mps on the simulated DGX H100. The
# agent starts one MPS control daemon for nvidia.com/gpu (the stand-in control program where the
# driver installs the real one: testing/mps) over the node's 8 GPUs with a quarter of the threads
# and memory for each client; 32 allocatable; a pod gets the MPS environment and the daemon's pipe
# directory and /dev/shm through the real kubelet and containerd, and what it writes into the
# control pipe reaches the daemon. The H100 node without MPS is restored at the end.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-mps
log=/run/nvidia/mps/nvidia.com_gpu/log/control.log
restore() {
  kc delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1 || true
}
trap restore EXIT
ctl="$GPULET_CLUSTER_RUN/driver-root/usr/bin/nvidia-cuda-mps-control"
[ -x "$ctl" ] && [ "$(head -c 2 "$ctl")" != '#!' ] || fail "$ctl: not the static stand-in (the node agent's image has no interpreter)"

kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null  # the DaemonSet's affinity
say "apply -k testing/cluster/overlays/sim-dgx-h100-mps (deploy/overlays/mps)"
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100-mps" >/dev/null 2>&1 \
  || fail "kubectl apply -k of the mps overlay failed: $(kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100-mps" 2>&1 | tail -3)"
until_true 180 "allocatable nvidia.com/gpu: 32 (4 MPS clients on each of 8 GPUs)" allocatable_is 32
daemon_started() { grep -q 'CMD set_default_active_thread_percentage 25' "$log"; }
until_true 60 "the MPS daemon started and set 25% of the threads ($log)" daemon_started
start="$(grep ' START ' "$log" | tail -1)"
visible="$(sed -n 's/.*CUDA_VISIBLE_DEVICES=\([^ ]*\).*/\1/p' <<< "$start")"
[ "$(tr ',' '\n' <<< "$visible" | grep -c '^GPU-')" = 8 ] || fail "the daemon's CUDA_VISIBLE_DEVICES is '$visible', want the 8 GPUs"
pinned="$(grep -c 'CMD set_default_device_pinned_mem_limit' "$log")"
[ "$pinned" -ge 8 ] || fail "pinned memory limits set for $pinned devices, want 8"
echo "daemon: 8 GPUs, 25% threads, $(grep 'CMD set_default_device_pinned_mem_limit 0 ' "$log" | tail -1 | sed 's/.*CMD //')"
fresh_namespace "$ns"

say "a pod with one MPS client share: the environment, the pipe directory and /dev/shm"
gpu_pod "$ns" mps-0 1 nvidia.com/gpu 'env | sort; echo PIPE: $(ls $CUDA_MPS_PIPE_DIRECTORY)'
until_true 120 "mps-0 Running" pod_phase_is "$ns" mps-0 Running
until_true 30 "mps-0 printed its environment" logs_have "$ns" mps-0 '^PIPE:'
out="$(kc logs -n "$ns" mps-0)"
grep -q '^CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25$' <<< "$out" || fail "mps-0: no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"
limit="$(sed -n 's/^CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=//p' <<< "$out")"
[[ "$limit" =~ ^0=[0-9]+M$ ]] || fail "mps-0: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is '$limit', want 0=<quarter>M"
grep -qw control <<< "$(sed -n 's/^PIPE://p' <<< "$out")" || fail "mps-0: the daemon's control pipe is not in \$CUDA_MPS_PIPE_DIRECTORY"
echo "mps-0: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$limit, pipe: $(sed -n 's/^PIPE: *//p' <<< "$out")"
# A request written into the control pipe from inside the pod reaches the daemon (the stand-in logs
# each command; its reply goes to a path in the agent's view, which the pod does not need here).
marker="gpulet_test_$$_$RANDOM"
kc exec -n "$ns" mps-0 -- sh -c "echo '/nonexistent $marker' > \$CUDA_MPS_PIPE_DIRECTORY/control"
reached() { grep -q "CMD $marker" "$log"; }
until_true 30 "the pod's request in the daemon's log" reached

trap - EXIT
back_to_h100 "$ns"
echo PASS
