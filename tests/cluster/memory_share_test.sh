#!/usr/bin/env bash
# A memory-limited shared GPU in a real container (issue 32, item 6): deploy/overlays/memory-limits
# on the simulated DGX H100 (4 time-sliced replicas a GPU, each held to a quarter of its memory).
# Nothing is injected by hand: the node's nvidia.com/gpu CDI spec (what `nvidia-ctk cdi generate`
# writes on a GPU node; here testing/cluster/sim_cdi_spec.py's for the stand-in driver root) brings
# the simulated CUDA driver, and Allocate brings libgpulet-cuda.so (/etc/ld.so.preload), its limits
# file and accounting directory. A CUDA program in the tenant's own image (Debian + memlimit_probe,
# no driver) gets its share of its GPU and not a byte more, through the real kubelet and containerd.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-memory
root="$GPULET_CLUSTER_RUN/driver-root"
spec=/var/run/cdi/gpulet-test-nvidia.json
restore() {
  kc delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1 || true
  rm -f "$spec"
}
trap restore EXIT

say "the node's nvidia.com/gpu CDI spec (the stand-in driver root's), as nvidia-ctk writes one"
"$repo/testing/cluster/sim_cdi_spec.py" --build "$build" --fixture-name dgx-h100 --driver-root "$root" --out "$spec"
sim="$(mktemp -d)"
gpu_mib="$("$build/gpulet" --log-level off --simulate dgx-h100 --sim-state "$sim" info -o json | \
  python3 -c 'import json, sys; print(json.load(sys.stdin)["gpus"][0]["memory_mib"])')"
rm -rf "$sim"

kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null  # the DaemonSet's affinity
say "apply -k testing/cluster/overlays/sim-dgx-h100-memory-limits (deploy/overlays/memory-limits)"
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100-memory-limits" >/dev/null 2>&1 \
  || fail "kubectl apply -k of the memory-limits overlay failed: $(kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100-memory-limits" 2>&1 | tail -3)"
until_true 180 "allocatable nvidia.com/gpu: 32 (4 replicas of 8 GPUs)" allocatable_is 32
until_true 120 "the agent pod Ready" agent_ready
[ -f /usr/lib/gpulet/libgpulet-cuda.so ] || fail "the init container did not install /usr/lib/gpulet/libgpulet-cuda.so"
fresh_namespace "$ns"

say "a pod with one replica runs a CUDA program: its share and not a byte more"
gib=1073741824; mib=1048576; ctx=$((512 * mib))
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: cuda-0, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
    - name: main
      image: localhost/gpulet/cuda-test:test
      imagePullPolicy: Never
      # 1 GiB chunks until refused, then 1 MiB chunks until refused; what the driver reports; hold.
      command: ["/usr/local/bin/memlimit_probe", "--via", "link", "init", "fill", "alloc", "$gib",
                "fill", "alloc", "$mib", "info", "hold"]
      env:
        - {name: GPULET_CUDA_SIM_CONTEXT_BYTES, value: "$ctx"}  # the simulated driver's context size
      resources:
        limits: {nvidia.com/gpu: 1}
YAML
until_true 120 "cuda-0 Running" pod_phase_is "$ns" cuda-0 Running
until_true 60 "cuda-0 filled its share" logs_have "$ns" cuda-0 '^holding'
out="$(kc logs -n "$ns" cuda-0)"
echo "$out"
# A quarter of the GPU (perReplica: auto), as the limits file says and cuMemGetInfo and NVML report.
share=$((gpu_mib * mib / 4))
share_held "$out" "$share" "$ctx"
grep -q "^info .*\bnvml_total=$share\b" <<< "$out" || fail "nvmlDeviceGetMemoryInfo total is not the share $share"

say "the pod's device: one GPU, the one Allocate gave (NVIDIA_VISIBLE_DEVICES) through CDI"
uuid="$(kc exec -n "$ns" cuda-0 -- sh -c 'echo $NVIDIA_VISIBLE_DEVICES' | cut -d: -f1)"
[[ "$uuid" =~ ^GPU- ]] || fail "cuda-0: NVIDIA_VISIBLE_DEVICES '$uuid'"
devs="$(kc exec -n "$ns" cuda-0 -- sh -c 'ls /dev | grep -E "^nvidia[0-9]+$"')"
[ "$(wc -w <<< "$devs")" = 1 ] || fail "cuda-0: GPU device nodes '$devs', want one"
echo "cuda-0: $uuid at /dev/$devs"

trap - EXIT
rm -f "$spec"
back_to_h100 "$ns"
echo PASS
