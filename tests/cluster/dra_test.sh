#!/usr/bin/env bash
# The DRA driver on the real cluster (issue 33): gpulet's DRA overlay deployed with kubectl apply -k;
# ResourceSlices the real API server accepts (partitionable devices, shared counters) and that come
# back when deleted; the admission policy refusing another node's slices; claims from the shipped
# examples allocated by the real scheduler, prepared by the real kubelet and run by containerd
# through gpulet's CDI specs; unprepare on delete. Runs after the device-plugin tests.
source "$(dirname "$0")/lib.sh"
examples="$repo/deploy/examples/dra"
ns=gpulet-test-dra

fresh_namespace "$ns"
say "deploy: kubectl apply -k of the DRA overlay; the node moves from the device plugin to DRA"
deploy_dra
slices() { kc get resourceslices --field-selector "spec.nodeName=$node" -o json; }
count_devices() {  # count_devices TYPE: devices of that gpu.gpulet.io type in the node's slices
  slices | python3 -c '
import json, sys
n = 0
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"].get("devices", []):
        if d.get("attributes", {}).get("type", {}).get("string") == sys.argv[1]:
            n += 1
print(n)' "$1"
}
eight_gpus() { [ "$(count_devices gpu)" = 8 ]; }
until_true 60 "the node's slices list 8 whole GPUs" eight_gpus
echo "published: $(count_devices gpu) GPUs, $(count_devices memory-share) memory shares, $(count_devices mig) MIG placements"
[ "$(count_devices mig)" -gt 0 ] || fail "no MIG placements published"
grep -q sharedCounters <<< "$(slices)" || fail "no shared counters (partitionable devices) in the slices"

say "a slice an admin deletes comes back"
victim="$(kc get resourceslices --field-selector "spec.nodeName=$node" -o jsonpath='{.items[1].metadata.name}')"
uid="$(kc get resourceslice "$victim" -o jsonpath='{.metadata.uid}')"
kc delete resourceslice "$victim" --wait=true >/dev/null
back() { local u; u="$(kc get resourceslice "$victim" -o jsonpath='{.metadata.uid}' 2>/dev/null)"; [ -n "$u" ] && [ "$u" != "$uid" ]; }
back_any() { back || eight_gpus; }
until_true 60 "the deleted slice published again" back_any
until_true 60 "8 GPUs after the deletion" eight_gpus

say "the admission policy stops the agent's identity writing another node's slice"
agent="$(kc get pods -n gpulet-system -l app.kubernetes.io/component=dra -o jsonpath='{.items[0].metadata.name}')"
token="$(kc create token gpulet-dra -n gpulet-system --bound-object-kind Pod --bound-object-name "$agent" --duration=10m)"
body='{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"gpulet-test-foreign"},
  "spec":{"driver":"gpu.gpulet.io","nodeName":"another-node","pool":{"name":"another-node","generation":1,"resourceSliceCount":1},
  "devices":[{"name":"gpu-0"}]}}'
code="$(curl -s -o /tmp/gpulet-dra-body.$$ -w '%{http_code}' --cacert "$GPULET_CLUSTER_BASE/pki/ca.crt" \
  -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -X POST --data "$body" \
  "$GPULET_CLUSTER_API/apis/resource.k8s.io/v1/resourceslices")"
answer="$(cat /tmp/gpulet-dra-body.$$)"; rm -f /tmp/gpulet-dra-body.$$
[ "$code" = 403 ] || [ "$code" = 422 ] || fail "a slice for another node answered $code: $answer"
grep -q 'own node' <<< "$answer" || fail "refused, but not by gpulet's policy: $answer"
echo "refused ($code): $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["message"])' "$answer")"

# claim_pod EXAMPLE: the example's objects in $ns, from the test image.
claim_pod() { python3 "$(dirname "$0")/example_pods.py" "$examples/$1.yaml" "$ns" | kc apply -f - >/dev/null; }
nvidia_nodes() { sed -n '/^DEV:/,$p' <<< "$(kc logs -n "$ns" "$1")" | grep -cE '^nvidia[0-9]+$' || true; }
check_pod() {  # check_pod POD GPUS: Running, and the container sees exactly GPUS device nodes
  until_true 120 "$1 Running" pod_phase_is "$ns" "$1" Running
  until_true 30 "$1 printed its /dev" logs_have "$ns" "$1" '^DEV:'
  local n; n="$(nvidia_nodes "$1")"
  [ "$n" = "$2" ] || fail "$1 sees $n GPU device nodes, want $2: $(kc logs -n "$ns" "$1" | sed -n '/^DEV:/,$p' | tr '\n' ' ')"
  local devs; devs="$(kc logs -n "$ns" "$1" | sed -n 's/^GPULET_DRA_DEVICES=//p')"
  [ -n "$devs" ] || fail "$1: no GPULET_DRA_DEVICES from the CDI spec"
  echo "$1: $devs"
}

say "claims from deploy/examples/dra, allocated by the real scheduler, prepared by the real kubelet"
claim_pod one-gpu
check_pod one-gpu 1
claim_pod two-gpus-nvlink
check_pod two-gpus-nvlink 2
claim_pod memory-share-20gi
check_pod memory-share-20gi 1
say "a pod asking nvidia.com/gpu: 1 is served by DRA through the DeviceClass's extendedResourceName"
# The kubelet must not still hold a device plugin's nvidia.com/gpu (it keeps one for 5 minutes after
# the plugin leaves, and then refuses such a pod: docs/dra-migration.md); this test runs first.
[ -z "$(node_field ".status.capacity.nvidia\.com/gpu")" ] || \
  fail "the node still has a device plugin's nvidia.com/gpu: run this test before the device-plugin tests"
claim_pod extended-resource
check_pod extended-resource-gpu 1

say "deleting a pod unprepares its claim: its CDI spec is gone"
claim_uid="$(kc get resourceclaims -n "$ns" -o json | python3 -c '
import json, sys
for c in json.load(sys.stdin)["items"]:
    if any(r.get("name") == "one-gpu" for r in c.get("status", {}).get("reservedFor", [])):
        print(c["metadata"]["uid"])')"
[ -n "$claim_uid" ] || fail "no claim reserved for one-gpu"
ls /var/run/cdi/*"$claim_uid"* >/dev/null 2>&1 || fail "no CDI spec for the prepared claim $claim_uid"
kc delete pod -n "$ns" one-gpu --wait=true --timeout=60s >/dev/null
spec_gone() { ! ls /var/run/cdi/*"$claim_uid"* >/dev/null 2>&1; }
until_true 60 "the claim's CDI spec removed after its pod" spec_gone

kc delete namespace "$ns" --wait=true --timeout=120s >/dev/null
undeploy_dra
echo PASS
