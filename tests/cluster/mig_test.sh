#!/usr/bin/env bash
# MIG, mixed strategy, on the real cluster (issue 32, item 6): deploy/overlays/mig-mixed on the
# simulated DGX A100 (GPUs 0 and 1 in MIG mode). The node advertises each profile as its own
# resource (nvidia.com/mig-3g.20gb …) beside the six whole GPUs; a pod asking for a profile gets its
# instance (the MIG UUID, the parent GPU's device node and exactly the instance's two capability
# nodes, through the real kubelet and containerd); a second 3g.20gb pod stays Pending with the
# scheduler's reason. The H100 node is restored at the end.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-mig
restore() {
  kc delete namespace "$ns" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1 || true
}
trap restore EXIT

# What the simulated A100 holds (the same fixture and driver as the agent's): each MIG device's
# UUID, profile, parent and capability nodes.
sim="$(mktemp -d)"
"$build/gpulet" --log-level off --simulate dgx-a100 --sim-state "$sim" info -o json > "$sim/info.json"
mig_field() {  # mig_field PROFILE FIELD: FIELD of the first MIG device with PROFILE
  python3 -c 'import json, sys
for g in json.load(open(sys.argv[1]))["gpus"]:
    for m in g["mig_devices"]:
        if m["profile"] == sys.argv[2]:
            print(g["index"] if sys.argv[3] == "parent" else m[sys.argv[3]]); sys.exit(0)' "$sim/info.json" "$1" "$2"
}
uuid_3g="$(mig_field 3g.20gb uuid)"; parent_3g="$(mig_field 3g.20gb parent)"
caps_3g="$(basename "$(mig_field 3g.20gb gi_cap_path)") $(basename "$(mig_field 3g.20gb ci_cap_path)")"
rm -rf "$sim"

kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null  # the DaemonSet's affinity
say "apply -k testing/cluster/overlays/sim-dgx-a100-mig-mixed (deploy/overlays/mig-mixed)"
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-a100-mig-mixed" >/dev/null 2>&1 \
  || fail "kubectl apply -k of the mig-mixed overlay failed: $(kc apply -k "$repo/testing/cluster/overlays/sim-dgx-a100-mig-mixed" 2>&1 | tail -3)"
allocatable_of() { [ "$(node_field ".status.allocatable.nvidia\.com/$1")" = "$2" ]; }
mixed_advertised() {
  allocatable_of gpu 6 && allocatable_of mig-3g\\.20gb 1 && allocatable_of mig-2g\\.10gb 1 \
    && allocatable_of mig-1g\\.5gb 9
}
until_true 180 "allocatable: nvidia.com/gpu 6, mig-3g.20gb 1, mig-2g.10gb 1, mig-1g.5gb 9" mixed_advertised
echo "allocatable: $(kc get node "$node" -o jsonpath='{.status.allocatable}' | tr ',' '\n' | grep nvidia | tr '\n' ' ')"
fresh_namespace "$ns"

say "a pod asking nvidia.com/mig-3g.20gb: 1 gets its instance"
mig_pod() {  # mig_pod NAME RESOURCE: prints its environment, /dev and /dev/nvidia-caps
  gpu_pod "$ns" "$1" 1 "$2" 'env | sort; echo DEV: $(ls /dev); echo CAPS: $(ls /dev/nvidia-caps)'
}
mig_pod m-0 nvidia.com/mig-3g.20gb
until_true 120 "m-0 Running" pod_phase_is "$ns" m-0 Running
until_true 30 "m-0 printed its devices" logs_have "$ns" m-0 '^CAPS:'
out="$(kc logs -n "$ns" m-0)"
visible="$(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<< "$out")"
[ "$visible" = "$uuid_3g" ] || fail "m-0: NVIDIA_VISIBLE_DEVICES is '$visible', want the 3g.20gb instance $uuid_3g"
caps="$(sed -n 's/^CAPS: *//p' <<< "$out")"
[ "$caps" = "$caps_3g" ] || fail "m-0: /dev/nvidia-caps holds '$caps', want exactly the instance's '$caps_3g'"
gpus="$(sed -n 's/^DEV: //p' <<< "$out" | tr ' ' '\n' | grep -E '^nvidia[0-9]+$' | tr '\n' ' ')"
[ "$gpus" = "nvidia$parent_3g " ] || fail "m-0: GPU device nodes '$gpus', want the parent's nvidia$parent_3g only"
echo "m-0: $visible, /dev/nvidia$parent_3g, /dev/nvidia-caps/{${caps// /,}}"

say "a second 3g.20gb pod: Pending, Insufficient nvidia.com/mig-3g.20gb"
mig_pod m-1 nvidia.com/mig-3g.20gb
until_true 60 "m-1 FailedScheduling: Insufficient nvidia.com/mig-3g.20gb" \
  scheduler_said "$ns" m-1 "Insufficient nvidia.com/mig-3g.20gb"
pod_phase_is "$ns" m-1 Pending || fail "m-1 is not Pending"

say "a 1g.5gb pod and a whole-GPU pod run beside it, on other devices"
mig_pod m-2 nvidia.com/mig-1g.5gb
mig_pod w-0 nvidia.com/gpu
for p in m-2 w-0; do
  until_true 120 "$p Running" pod_phase_is "$ns" "$p" Running
  until_true 30 "$p printed its devices" logs_have "$ns" "$p" '^CAPS:'
done
v2="$(kc logs -n "$ns" m-2 | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')"
[[ "$v2" =~ ^MIG- ]] && [ "$v2" != "$uuid_3g" ] || fail "m-2: NVIDIA_VISIBLE_DEVICES is '$v2', want another MIG instance"
[ "$(kc logs -n "$ns" m-2 | sed -n 's/^CAPS: *//p' | wc -w)" = 2 ] || fail "m-2: not exactly two capability nodes"
w="$(kc logs -n "$ns" w-0)"
[[ "$(sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p' <<< "$w")" =~ ^GPU- ]] || fail "w-0: no whole GPU's UUID"
wgpu="$(sed -n 's/^DEV: //p' <<< "$w" | tr ' ' '\n' | grep -E '^nvidia[0-9]+$')"
case "$wgpu" in nvidia[2-7]) ;; *) fail "w-0 got /dev/$wgpu, want one of the six GPUs not in MIG mode (2-7)";; esac
[ -z "$(sed -n 's/^CAPS: *//p' <<< "$w")" ] || fail "w-0: a whole GPU's pod was given MIG capability nodes"
echo "m-2: $v2; w-0: /dev/$wgpu"

trap - EXIT
back_to_h100 "$ns"
echo PASS
