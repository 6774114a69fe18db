#!/usr/bin/env bash
# DRA claims doing work in real containers (issue 33, item 3), on a node with an nvidia.com/gpu CDI
# spec (what `nvidia-ctk cdi generate` writes; here testing/cluster/sim_cdi_spec.py's for the
# stand-in driver root), which gpulet's own specs refer to for the GPU and the driver:
# - a 20 GiB memory share from deploy/examples/dra: a CUDA program in the tenant's own image (no
#   driver in it) gets 20 GiB of its GPU and not a byte more, through the claim's CDI spec alone;
# - a MIG profile from deploy/examples/dra on the H100 (no MIG device exists before): the DRA
#   driver makes the instance when the kubelet prepares the claim, the container sees the parent
#   GPU and exactly the instance's capability nodes, and the instance is gone once the pod is;
# - the DRA DaemonSet's exporter labels the share's GPU with the pod and the claim, read from the
#   real kubelet's pod-resources API (dcgm-exporter's dra_* label names).
source "$(dirname "$0")/lib.sh"
examples="$repo/deploy/examples/dra"
ns=gpulet-test-dra-work
root="$GPULET_CLUSTER_RUN/driver-root"
spec=/var/run/cdi/gpulet-test-nvidia.json
finish() {
  kc delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  undeploy_dra
  rm -f "$spec"
}
trap finish EXIT

say "the node's nvidia.com/gpu CDI spec, and gpulet's DRA overlay"
"$repo/testing/cluster/sim_cdi_spec.py" --build "$build" --fixture-name dgx-h100 --driver-root "$root" --out "$spec"
fresh_namespace "$ns"
deploy_dra
gpus_published() {
  [ "$(kc get resourceslices --field-selector "spec.nodeName=$node" -o json | grep -c '"string": "gpu"')" -ge 8 ]
}
until_true 60 "the node's slices list its GPUs" gpus_published

say "memory-share-20gi: a CUDA program gets 20 GiB and not a byte more"
gib=1073741824; mib=1048576; share=$((20 * gib))
python3 "$(dirname "$0")/example_pods.py" "$examples/memory-share-20gi.yaml" "$ns" \
  --cuda "--via link init fill alloc $gib fill alloc $mib info hold" | kc apply -f - >/dev/null
until_true 120 "memory-share-20gi Running" pod_phase_is "$ns" memory-share-20gi Running
until_true 60 "memory-share-20gi filled its share" logs_have "$ns" memory-share-20gi '^holding'
out="$(kc logs -n "$ns" memory-share-20gi)"
echo "$out"
# The simulated driver's context: 300 MiB unless the pod says otherwise (it does not here).
share_held "$out" "$share" $((300 * mib))

say "the exporter attributes the claim's GPU to the pod, with the claim (issue 33 item 5)"
agent="$(kc get pods -n gpulet-system -l app.kubernetes.io/component=dra -o jsonpath='{.items[0].metadata.name}')"
agent_ip="$(kc get pod -n gpulet-system "$agent" -o jsonpath='{.status.podIP}')"
claim="$(kc get pod -n "$ns" memory-share-20gi -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
[ -n "$claim" ] || fail "memory-share-20gi: no claim in its status"
attributed() {
  grep -q "^DCGM_FI_DEV_FB_USED{.*dra_claim_name=\"$claim\",dra_claim_namespace=\"$ns\",.*dra_driver_name=\"gpu.gpulet.io\",dra_pool_name=\"$node\",namespace=\"$ns\",pod=\"memory-share-20gi\"" \
    <<< "$(curl -s --max-time 5 "http://$agent_ip:9400/metrics")"
}
until_true 60 "DCGM_FI_DEV_FB_USED of the claim's GPU labelled with pod memory-share-20gi and claim $claim" attributed
curl -s --max-time 5 "http://$agent_ip:9400/metrics" | grep -m1 '^DCGM_FI_DEV_FB_USED{.*pod="memory-share-20gi"' || true
kc delete pod -n "$ns" memory-share-20gi --wait=true --timeout=60s >/dev/null

say "mig-1g: the DRA driver makes the instance at prepare, and it is gone after the pod"
mig_count() {  # MIG devices on the simulated node, as the DRA driver's own NVML sees them
  kc exec -n gpulet-system "$agent" -c gpulet -- gpulet --log-level off info -o json | \
    python3 -c 'import json, sys; print(sum(len(g["mig_devices"]) for g in json.load(sys.stdin)["gpus"]))'
}
[ "$(mig_count)" = 0 ] || fail "MIG devices exist before any claim: $(mig_count)"
python3 "$(dirname "$0")/example_pods.py" "$examples/mig-1g.yaml" "$ns" | kc apply -f - >/dev/null
until_true 120 "mig-1g Running" pod_phase_is "$ns" mig-1g Running
until_true 30 "mig-1g printed its /dev" logs_have "$ns" mig-1g '^DEV:'
[ "$(mig_count)" = 1 ] || fail "while mig-1g runs the node has $(mig_count) MIG devices, want 1"
devices="$(kc logs -n "$ns" mig-1g | sed -n 's/^GPULET_DRA_DEVICES=//p')"
[[ "$devices" == *MIG-* ]] || fail "mig-1g: GPULET_DRA_DEVICES '$devices' names no MIG device"
caps="$(kc exec -n "$ns" mig-1g -- ls /dev/nvidia-caps | wc -w)"
[ "$caps" = 2 ] || fail "mig-1g sees $caps capability nodes, want the instance's 2"
echo "mig-1g: $devices, 2 capability nodes"
say "the DRA driver killed and restarted between prepare and unprepare: nothing is left behind"
mig_claim="$(kc get pod -n "$ns" mig-1g -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')"
mig_uid="$(kc get resourceclaim -n "$ns" "$mig_claim" -o jsonpath='{.metadata.uid}')"
ls /var/run/cdi/*"$mig_uid"* >/dev/null 2>&1 || fail "no CDI spec for the prepared claim $mig_uid"
kc delete pod -n gpulet-system "$agent" --grace-period=0 --force >/dev/null 2>&1
new_agent() {
  agent="$(kc get pods -n gpulet-system -l app.kubernetes.io/component=dra -o json | python3 -c '
import json, sys
for p in json.load(sys.stdin)["items"]:
    if p["metadata"].get("deletionTimestamp") is None and all(c.get("ready") for c in p["status"].get("containerStatuses", [{}])):
        print(p["metadata"]["name"])')"
  [ -n "$agent" ] && [ "$agent" != "$1" ]
}
old_agent="$agent"
until_true 120 "a new gpulet-dra pod Ready" new_agent "$old_agent"
pod_phase_is "$ns" mig-1g Running || fail "mig-1g disturbed by the driver's restart"
[ "$(mig_count)" = 1 ] || fail "the MIG instance did not outlive the driver's restart (as on a GPU): $(mig_count)"
kc delete pod -n "$ns" mig-1g --wait=true --timeout=60s >/dev/null
no_mig() { [ "$(mig_count)" = 0 ]; }
until_true 60 "the MIG instance removed after its pod (by the restarted driver)" no_mig
spec_gone() { ! ls /var/run/cdi/*"$mig_uid"* >/dev/null 2>&1; }
until_true 60 "the claim's CDI spec removed" spec_gone
[ ! -e "/run/gpulet/dra/claims/$mig_uid.json" ] || fail "the claim's record is still in the driver's state directory"
echo "restarted driver: $old_agent -> $agent; instance, CDI spec and record gone with the pod"
echo PASS
