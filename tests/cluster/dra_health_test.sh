#!/usr/bin/env bash
# DRA health on the real cluster (issue 33 items 4 and 6): the standard resource.kubernetes.io/
# attributes in the slices the real API server holds; an XID on the GPU a pod's claim holds reaches
# the pod's status (status.containerStatuses[].allocatedResourcesStatus, which the real kubelet 1.37
# fills from gpulet's DRAResourceHealth stream: ResourceHealthStatus is on by default) and the
# device's taint in the slice; recovery clears both. Runs after dra_test.sh (same overlay).
source "$(dirname "$0")/lib.sh"
examples="$repo/deploy/examples/dra"
ns=gpulet-test-dra-health

fresh_namespace "$ns"
say "deploy: the DRA overlay on the node"
deploy_dra
slices() { kc get resourceslices --field-selector "spec.nodeName=$node" -o json; }
# devices_json: {device name: device} of the node's gpu.gpulet.io slices.
devices_json() {
  slices | python3 -c '
import json, sys
out = {}
for s in json.load(sys.stdin)["items"]:
    if s["spec"].get("driver") == "gpu.gpulet.io":
        for d in s["spec"].get("devices", []):
            out[d["name"]] = d
print(json.dumps(out))'
}
eight_gpus() {
  [ "$(devices_json | python3 -c 'import json,sys; print(sum(1 for n in json.load(sys.stdin) if n.count("-") == 1))')" = 8 ]
}
until_true 60 "the node's slices list 8 whole GPUs" eight_gpus

say "standard attributes: resource.kubernetes.io/pciBusID and numaNode in upstream's forms, nothing else of the prefix"
verdict="$(devices_json | python3 -c '
import json, re, sys
bdf = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")
bad, n = [], 0
for name, d in json.load(sys.stdin).items():
    a = d.get("attributes", {})
    n += 1
    bus = a.get("resource.kubernetes.io/pciBusID", {}).get("string", "")
    if not bdf.match(bus):
        bad.append(f"{name}: pciBusID {bus!r}")
    numa = a.get("resource.kubernetes.io/numaNode", {})
    if not isinstance(numa.get("int"), int) or numa["int"] < 0:
        bad.append(f"{name}: numaNode {numa!r}")
    root = a.get("resource.kubernetes.io/pcieRoot", {}).get("string")
    if root is not None and not re.match(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$", root):
        bad.append(f"{name}: pcieRoot {root!r}")
    for k in a:
        if k.startswith("resource.kubernetes.io/") and k.split("/", 1)[1] not in ("pciBusID", "pcieRoot", "numaNode"):
            bad.append(f"{name}: {k} is not a standard attribute")
print("ok", n) if not bad else print("; ".join(bad[:5]))')"
[ "${verdict%% *}" = ok ] || fail "standard attributes: $verdict"
echo "every device (${verdict#ok }) carries pciBusID and numaNode in upstream's form"

say "a pod with one whole GPU; its container's allocatedResourcesStatus reports the device Healthy"
python3 "$(dirname "$0")/example_pods.py" "$examples/one-gpu.yaml" "$ns" | kc apply -f - >/dev/null
until_true 120 "one-gpu Running" pod_phase_is "$ns" one-gpu Running
device="$(kc get resourceclaims -n "$ns" -o json | python3 -c '
import json, sys
for c in json.load(sys.stdin)["items"]:
    if any(r.get("name") == "one-gpu" for r in c.get("status", {}).get("reservedFor", [])):
        print(c["status"]["allocation"]["devices"]["results"][0]["device"])')"
[[ "$device" =~ ^gpu-[0-9]+$ ]] || fail "the claim of one-gpu holds '$device', not a whole GPU"
gpu="${device#gpu-}"
# health_is STATE: the pod's container reports STATE for its claim's one device.
status_json() { kc get pod -n "$ns" one-gpu -o jsonpath='{.status.containerStatuses[0].allocatedResourcesStatus}'; }
health_is() {
  python3 -c '
import json, sys
st = json.loads(sys.argv[1] or "[]")
hs = [r.get("health") for s in st if s.get("name", "").startswith("claim:gpu") for r in s.get("resources", [])]
sys.exit(0 if hs == [sys.argv[2]] else 1)' "$(status_json)" "$1"
}
until_true 90 "one-gpu's allocatedResourcesStatus: $device Healthy" health_is Healthy
echo "allocatedResourcesStatus: $(status_json)"
agent="$(kc get pods -n gpulet-system -l app.kubernetes.io/component=dra -o jsonpath='{.items[0].metadata.name}')"
# The kubelet 1.37 picks the v1 health service (v1alpha1 only for drivers without it).
grep -q 'event=dra_health_stream_opened service=v1.DRAResourceHealth' <<< "$(kc logs -n gpulet-system "$agent" -c gpulet)" \
  || fail "the kubelet did not open the v1 health stream: $(kc logs -n gpulet-system "$agent" -c gpulet | grep dra_health_stream || true)"
echo "the kubelet streams health over v1.DRAResourceHealth"

tainted() {
  devices_json | python3 -c '
import json, sys
d = json.load(sys.stdin).get(sys.argv[1], {})
sys.exit(0 if any(t.get("key") == "gpu.gpulet.io/unhealthy" for t in d.get("taints", [])) else 1)' "$device"
}
tainted && fail "$device tainted before any XID"

say "XID 79 on $device: the pod's status says Unhealthy and the device is tainted"
# A second, free GPU gets the same XID: kube-scheduler must not allocate it while it is tainted.
free=$(( (gpu + 1) % 8 ))
free_uuid="$(devices_json | python3 -c 'import json, sys; print(json.load(sys.stdin)["gpu-" + sys.argv[1]]["attributes"]["uuid"]["string"])' "$free")"
for g in "$gpu" "$free"; do
  kc exec -n gpulet-system "$agent" -c gpulet -- gpulet sim xid --gpu "$g" --code 79 >/dev/null \
    || fail "gpulet sim xid in the DRA agent's pod failed"
done
until_true 60 "one-gpu's allocatedResourcesStatus: $device Unhealthy" health_is Unhealthy
echo "allocatedResourcesStatus: $(status_json)"
until_true 60 "$device tainted gpu.gpulet.io/unhealthy in the slice" tainted
free_tainted() { device="gpu-$free" tainted; }
until_true 60 "gpu-$free tainted gpu.gpulet.io/unhealthy in the slice" free_tainted
pinned_claim_pod "$ns" on-tainted gpu.gpulet.io "device.attributes[\"gpu.gpulet.io\"].uuid == \"$free_uuid\""
tainted_refused() { pod_phase_is "$ns" on-tainted Pending && scheduler_said "$ns" on-tainted "cannot allocate all claims"; }
until_true 60 "a claim for the tainted gpu-$free Pending with the scheduler's reason" tainted_refused
echo "on-tainted: Pending while gpu-$free is tainted"

say "recovery: Healthy again and the taint gone"
until_true 150 "one-gpu's allocatedResourcesStatus: $device Healthy after recovery" health_is Healthy
untainted() { ! tainted; }
until_true 60 "$device untainted after recovery" untainted
until_true 150 "on-tainted allocated gpu-$free once its taint cleared" pod_phase_is "$ns" on-tainted Running
echo "on-tainted: Running on gpu-$free after recovery"

kc delete namespace "$ns" --wait=true --timeout=120s >/dev/null
undeploy_dra
echo PASS
