#!/usr/bin/env bash
# Quotas and admission for memory-sized requests on the real API server (issue 34 item 2; the
# whole-GPU case is tests/cluster/quota_test.sh):
# - `gpulet quota` renders a tenant's ResourceQuota with requests.gpulet.io/gpu-memory-1gi and its
#   per-container GPU cap policy; the API server admits memory pods within the quota (the
#   extender then binds them on the "fleet" nodes), refuses one past it with its own quota message,
#   admits again once a pod is deleted, and refuses what no quota is needed for: a fraction of a
#   unit, requests unequal to limits, a container past the cap;
# - a pod naming the memory resource with 0 units is bound (kube-scheduler leaves its bind to the
#   extender);
# - deploy/examples/memory-pool-admission-policy.yaml: a node agent's token (the gpulet
#   ServiceAccount, bound to a pod on fleet-00000, as the kubelet's projected token is) may write
#   gpulet-memory-fleet-00000 and nothing else: another node's object, a new one, a wrong label,
#   or a token without the node claim are denied with the policy's message.
source "$(dirname "$0")/lib.sh"
cluster_env
ns=fleet-quota
build="${GPULET_BUILD_DIR:?GPULET_BUILD_DIR (the build directory) is not set}"
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

# tenant_pod NAME [LIMITS [REQUESTS]]: a pod of the gpulet-memory profile in $ns on the "fleet"
# nodes; prints the API server's answer, returns kubectl's status.
tenant_pod() {
  local req=""
  [ -n "${3:-}" ] && req="requests: {$3}"
  kc apply -f - 2>&1 <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $ns}
spec:
  schedulerName: gpulet-memory
  terminationGracePeriodSeconds: 0
  nodeSelector: {gpulet.io/fleet: fleet}
  containers:
    - name: main
      image: localhost/gpulet/test:test
      resources:
        limits: {${2:-gpulet.io/gpu-memory-1gi: 1}}
        $req
YAML
}
refused() {  # refused NAME TEXT LIMITS [REQUESTS]: the API server refuses the pod, saying TEXT
  local out
  if out="$(tenant_pod "$1" "$3" "${4:-}")"; then fail "$1 was admitted: $out"; fi
  [[ "$out" == *"$2"* ]] || fail "$1 refused, but not with '$2': $out"
  echo "refused: $out"
}
quota_used() { kc get resourcequota -n "$ns" gpu-quota -o jsonpath='{.status.used.requests\.gpulet\.io/gpu-memory-1gi}'; }
used_is() { [ "$(quota_used)" = "$1" ]; }

say "gpulet quota: 100 GiB of GPU memory and 2 GPUs (at most 1 a container) for $ns, applied"
cat > "$work/tenants.yaml" <<YAML
tenants:
  - namespace: $ns
    gpus: 2
    gpuMemory: 100
    maxPerContainer: 1
YAML
"$build/gpulet" quota --tenants "$work/tenants.yaml" --inventory "$repo/deploy/examples/inventory-h100-node.json" \
  > "$work/quota.yaml" || fail "gpulet quota refused the tenants file"
grep -q 'requests.gpulet.io/gpu-memory-1gi: "100"' "$work/quota.yaml" || fail "no memory line: $(cat "$work/quota.yaml")"
fresh_namespace "$ns"
kc apply -f "$work/quota.yaml" >/dev/null || fail "the API server refused gpulet quota's manifests: $(cat "$work/quota.yaml")"
until_true 30 "ResourceQuota status computed" used_is 0

say "60 + 40 GiB: within the quota, admitted, bound by the extender; the quota counts their limits"
for p in "m60 60" "m40 40"; do
  set -- $p
  tenant_pod "$1" "gpulet.io/gpu-memory-1gi: $2" >/dev/null || fail "$1 refused within the quota"
done
until_true 90 "m60 bound" pod_bound "$ns" m60
until_true 90 "m40 bound" pod_bound "$ns" m40
until_true 30 "quota used 100" used_is 100

say "one more GiB: refused by the API server with its quota message"
refused m1 'exceeded quota: gpu-quota, requested: requests.gpulet.io/gpu-memory-1gi=1, used: requests.gpulet.io/gpu-memory-1gi=100, limited: requests.gpulet.io/gpu-memory-1gi=100' \
  'gpulet.io/gpu-memory-1gi: 1'

say "m40 deleted: the quota controller gives its 40 back, and a pod of 40 is admitted"
kc delete pod -n "$ns" m40 --grace-period=0 --force >/dev/null 2>&1
until_true 60 "quota used back to 60" used_is 60
tenant_pod m40b 'gpulet.io/gpu-memory-1gi: 40' >/dev/null || fail "m40b refused after m40 was deleted"
until_true 90 "m40b bound" pod_bound "$ns" m40b

say "requests the API server refuses before any quota or extender sees them"
refused half 'Invalid value: "500m": must be an integer' 'gpulet.io/gpu-memory-1gi: 500m'
refused unequal 'must be equal to gpulet.io/gpu-memory-1gi limit of 20' 'gpulet.io/gpu-memory-1gi: 20' \
  'gpulet.io/gpu-memory-1gi: 10'
# A policy is enforced once the API server's informer has it, a moment after its create: a pod
# let through before is deleted and the request made again.
cap_out=""
cap_refuses() {
  if cap_out="$(tenant_pod two-gpus 'nvidia.com/gpu: 2')"; then
    kc delete pod -n "$ns" two-gpus --grace-period=0 --force >/dev/null 2>&1; return 1
  fi
}
until_true 60 "a container of 2 GPUs refused" cap_refuses
[[ "$cap_out" == *"ValidatingAdmissionPolicy 'gpulet-gpu-cap-$ns' with binding 'gpulet-gpu-cap-$ns' denied request: at most 1 nvidia.com/gpu per container in $ns (gpulet quota maxPerContainer)"* ]] \
  || fail "two-gpus refused, but not by the cap policy: $cap_out"
echo "refused: $cap_out"

say "0 GiB: admitted, and bound by the extender (kube-scheduler leaves the bind of a pod naming the"
say "resource to it), holding no units"
r0="$(ext_metric gpulet_extender_reserved_units)"
tenant_pod zero 'gpulet.io/gpu-memory-1gi: 0' >/dev/null || fail "a 0 GiB pod was refused"
until_true 60 "zero bound" pod_bound "$ns" zero
# (At most r0: earlier tests' reservations may still be ending; exactly none in
# ExtenderHttpTest.APodAskingZeroUnitsIsBoundWithoutAReservation.)
[ "$(ext_metric gpulet_extender_reserved_units)" -le "$r0" ] || fail "the 0 GiB pod reserved units"
kc delete namespace "$ns" --wait=false >/dev/null

say "memory-pool-admission-policy.yaml: a node agent writes its own node's pool object only"
kc apply -n gpulet-system -f "$repo/deploy/base/serviceaccount.yaml" -f "$repo/deploy/base/rbac.yaml" \
  -f "$repo/deploy/examples/memory-pool-admission-policy.yaml" >/dev/null || fail "deploy/base RBAC or the policy refused"
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: agent-fleet-00000, namespace: gpulet-system}
spec:
  serviceAccountName: gpulet
  nodeName: fleet-00000
  terminationGracePeriodSeconds: 0
  containers: [{name: gpulet, image: localhost/gpulet/test:test}]
YAML
agent_uid="$(kc get pod -n gpulet-system agent-fleet-00000 -o jsonpath='{.metadata.uid}')"
# The token the kubelet projects into the agent's pod: bound to the pod, so it carries the node.
kc create token gpulet -n gpulet-system --bound-object-kind Pod --bound-object-name agent-fleet-00000 \
  --bound-object-uid "$agent_uid" --duration 1h > "$work/agent.token"
kc create token gpulet -n gpulet-system --duration 1h > "$work/unbound.token"
as_token() {  # as_token FILE KUBECTL ARGS...: kubectl with only that token
  local t="$1"; shift
  kubectl --request-timeout=30s --kubeconfig=/dev/null --server="$GPULET_CLUSTER_API" \
    --certificate-authority="$GPULET_CLUSTER_BASE/pki/ca.crt" --token="$(cat "$t")" "$@"
}
who="$(as_token "$work/agent.token" auth whoami -o jsonpath='{.status.userInfo.extra.authentication\.kubernetes\.io/node-name[0]}')"
[ "$who" = "fleet-00000" ] || fail "the agent's token names node '$who', not fleet-00000"
denial="ValidatingAdmissionPolicy 'gpulet-memory-pool-own-node' with binding 'gpulet-memory-pool-own-node' denied request: a gpulet node agent may write only the ConfigMap gpulet-memory-<its node>, labelled gpulet.io/node=<its node>"
# The publisher's own writes (deviceplugin/memory_publisher.cc): a merge patch of labels and data.
patch_as() {  # patch_as TOKEN NODE LABEL
  as_token "$1" patch configmap -n gpulet-system "gpulet-memory-$2" --type merge \
    -p "{\"metadata\":{\"labels\":{\"gpulet.io/node\":\"$3\"}},\"data\":{\"policy-test\":\"1\"}}" 2>&1
}
# The API server enforces a new policy once its informer has it, a moment after the create: until
# then a foreign write passes. Probe with a write that changes nothing if let through.
in_force() {
  local o
  o="$(as_token "$work/agent.token" patch configmap -n gpulet-system gpulet-memory-fleet-00001 --type merge \
    -p '{"metadata":{"labels":{"gpulet.io/node":"fleet-00001"}}}' 2>&1)" && return 1
  [[ "$o" == *"$denial"* ]]
}
until_true 60 "the memory-pool policy denies a foreign write" in_force
out="$(patch_as "$work/agent.token" fleet-00000 fleet-00000)" || fail "the agent of fleet-00000 may not write its own object: $out"
for args in "agent fleet-00001 fleet-00001" "agent fleet-00000 fleet-00001" "unbound fleet-00000 fleet-00000"; do
  set -- $args
  if out="$(patch_as "$work/$1.token" "$2" "$3")"; then fail "token $1 wrote gpulet-memory-$2 labelled $3: $out"; fi
  [[ "$out" == *"$denial"* ]] || fail "token $1, gpulet-memory-$2 labelled $3: not the policy's denial: $out"
  echo "denied ($1 token, gpulet-memory-$2 labelled $3): ${out#*denied request: }"
done
# The publisher's create (POST) of an object for a node that has none yet.
if out="$(as_token "$work/agent.token" create configmap -n gpulet-system gpulet-memory-fleet-99999 \
  --from-literal=memory.json='{}' 2>&1)"; then fail "the agent of fleet-00000 created another node's object"; fi
[[ "$out" == *"$denial"* ]] || fail "create of another node's object: not the policy's denial: $out"

kc delete pod -n gpulet-system agent-fleet-00000 --grace-period=0 --force >/dev/null 2>&1
kc delete -f "$repo/deploy/examples/memory-pool-admission-policy.yaml" >/dev/null
echo PASS
