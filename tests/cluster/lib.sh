# Shared by the real-cluster tests (sourced). Each test runs against the cluster that the
# cluster_up fixture brought up (testing/cluster/cluster.sh), as the cluster's admin unless it says
# otherwise, and prints what it checks; a failed check prints the evidence and exits 1.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${GPULET_BUILD_DIR:?GPULET_BUILD_DIR (the build directory) is not set}"
eval "$("$repo/testing/cluster/cluster.sh" env)"
node="$GPULET_CLUSTER_NODE"

source "$repo/tests/cluster/common.sh"

node_field() { kc get node "$node" -o jsonpath="{$1}"; }
allocatable_is() { [ "$(node_field ".status.allocatable.nvidia\.com/gpu")" = "$1" ]; }
capacity_is() { [ "$(node_field ".status.capacity.nvidia\.com/gpu")" = "$1" ]; }
pod_phase_is() { [ "$(kc get pod -n "$1" "$2" -o jsonpath='{.status.phase}')" = "$3" ]; }

# gpu_pod NAMESPACE NAME COUNT [RESOURCE [SCRIPT]]: a pod of the test image asking for COUNT GPUs
# that runs SCRIPT (sh; default: print its environment and /dev), then waits.
gpu_pod() {
  local ns="$1" name="$2" count="$3" res="${4:-nvidia.com/gpu}"
  local script="${5:-env | sort; echo DEV:; ls /dev}"
  kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
    - name: main
      image: localhost/gpulet/test:test
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "$script; exec sleep 100000"]
      resources:
        limits: {$res: $count}
YAML
}

# scheduler_said NAMESPACE POD TEXT: the scheduler's FailedScheduling event for POD contains TEXT.
scheduler_said() {
  grep -q -- "$3" <<< "$(kc get events -n "$1" --field-selector "involvedObject.name=$2,reason=FailedScheduling" \
    -o jsonpath='{.items[*].message}')"
}

logs_have() {  # logs_have NAMESPACE POD PATTERN
  grep -q -- "$3" <<< "$(kc logs -n "$1" "$2" 2>/dev/null)"
}

fresh_namespace() {  # fresh_namespace NAME: an empty namespace (an earlier one deleted first)
  kc delete namespace "$1" --ignore-not-found --wait=true --timeout=120s >/dev/null
  kc create namespace "$1" >/dev/null
  until_true 60 "default ServiceAccount in $1" kc get serviceaccount -n "$1" default
}

# agent_pod: the name of the node agent's Running, Ready pod that is not being deleted ("" if none).
agent_pod() {
  kc get pods -n gpulet-system -l app.kubernetes.io/component=node -o json | python3 -c '
import json, sys
pods = [p for p in json.load(sys.stdin)["items"]
        if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"
        and p["status"].get("containerStatuses") and all(c.get("ready") for c in p["status"]["containerStatuses"])]
print(pods[0]["metadata"]["name"] if pods else "")'
}
agent_ready() { [ -n "$(agent_pod)" ]; }

# deploy_dra: gpulet's DRA overlay (testing/cluster/overlays/sim-dgx-h100-dra) applied as a user
# does, the node labelled for it, and its DaemonSet rolled out. undeploy_dra: both undone.
dra_overlay="$repo/testing/cluster/overlays/sim-dgx-h100-dra"
deploy_dra() {
  kc label node "$node" nvidia.com/gpu.present=true gpulet.io/dra=true --overwrite >/dev/null
  kc apply -k "$dra_overlay" >/dev/null 2>&1 || kc apply -k "$dra_overlay"
  kc -n gpulet-system rollout status daemonset/gpulet-dra --timeout=180s >/dev/null || fail "gpulet-dra not ready"
}
undeploy_dra() {
  kc delete -k "$dra_overlay" --wait=true --timeout=120s >/dev/null 2>&1 || true
  kc label node "$node" gpulet.io/dra- >/dev/null 2>&1 || true
}

# pinned_claim_pod NAMESPACE NAME CLASS CEL [MEMORY]: a ResourceClaim NAME from DeviceClass CLASS whose
# device also satisfies the CEL expression (and asks MEMORY of its capacity), and a pod NAME of the
# test image using it.
pinned_claim_pod() {
  local capacity=""
  [ -z "${5:-}" ] || capacity="
          capacity: {requests: {memory: $5}}"
  kc apply -f - >/dev/null <<YAML
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: $2, namespace: $1}
spec:
  devices:
    requests:
      - name: r
        exactly:
          deviceClassName: $3
          selectors: [{cel: {expression: '$4'}}]$capacity
---
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: $1}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  resourceClaims: [{name: r, resourceClaimName: $2}]
  containers:
    - name: main
      image: localhost/gpulet/test:test
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "exec sleep 100000"]
      resources: {claims: [{name: r}]}
YAML
}

# share_held OUTPUT SHARE CONTEXT: memlimit_probe's OUTPUT (init, fill 1 GiB, fill 1 MiB, info) shows
# a CUDA program held to SHARE bytes: cuInit worked, cuMemGetInfo says SHARE, both fills ended with
# CUDA_ERROR_OUT_OF_MEMORY, and after the simulated driver's CONTEXT bytes the 1 GiB chunks took
# what fits and the 1 MiB chunks the rest but for less than 1 MiB. Prints what was admitted.
share_held() {
  local out="$1" share="$2" ctx="$3" gib=1073741824 mib=1048576 big small
  field() { sed -n "s/.*\b$2=\([0-9-]*\).*/\1/p" <<< "$(grep "^$1 " <<< "$out" | sed -n "${3:-1}p")"; }
  [ "$(field init rc)" = 0 ] || fail "cuInit and the primary context failed in the container"
  [ "$(field info cu_total)" = "$share" ] || fail "cuMemGetInfo total $(field info cu_total), want the share $share"
  [ "$(field fill last_rc 1)" = 2 ] && [ "$(field fill last_rc 2)" = 2 ] \
    || fail "an allocation past the share was not refused with CUDA_ERROR_OUT_OF_MEMORY"
  big="$(field fill admitted 1)"; small="$(field fill admitted 2)"
  [ "$big" = $(((share - ctx) / gib * gib)) ] || fail "1 GiB chunks admitted $big, want $(((share - ctx) / gib * gib))"
  [ "$small" = $(((share - ctx - big) / mib * mib)) ] || fail "1 MiB chunks admitted $small after, want $(((share - ctx - big) / mib * mib))"
  echo "share $share B: context $ctx + $big + $small B admitted, $((share - ctx - big - small)) B left"
}

# back_to_h100 NAMESPACE: a test that deployed another overlay of the node agent ends: its
# namespace deleted, the plain H100 overlay applied again, 8 GPUs allocatable.
back_to_h100() {
  say "back to the plain H100 node"
  kc delete namespace "$1" --wait=true --timeout=120s >/dev/null
  kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
  until_true 180 "allocatable nvidia.com/gpu: 8" allocatable_is 8
}
