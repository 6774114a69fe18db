#!/usr/bin/env bash
# `gpulet quota` on the real API server (issue 32, item 7): the ResourceQuota and admission policy it
# renders from the agent's own inventory are enforced; a pod past the namespace's GPU quota is
# refused with the API server's message. Runs after cluster_device_plugin, with the agent deployed.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-quota
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

kc -n gpulet-system rollout status daemonset/gpulet --timeout=120s >/dev/null || fail "gpulet DaemonSet not ready"
until_true 60 "the agent pod Ready" agent_ready
pod="$(agent_pod)"
kc exec -n gpulet-system "$pod" -c gpulet -- gpulet info --output json > "$work/inventory.json" \
  || fail "gpulet info in the agent's pod failed"
cat > "$work/tenants.yaml" <<YAML
tenants:
  - namespace: $ns
    gpus: 2
    maxPerContainer: 1
YAML
fresh_namespace "$ns"
quota_counted() { grep -q nvidia <<< "$(kc get resourcequota -n "$1" -o jsonpath='{.items[*].status.hard}')"; }
"$build/gpulet" quota --tenants "$work/tenants.yaml" --inventory "$work/inventory.json" > "$work/quota.yaml" \
  || fail "gpulet quota refused the tenants file"
kc apply -f "$work/quota.yaml" >/dev/null || fail "the API server refused gpulet quota's manifests: $(cat "$work/quota.yaml")"
until_true 30 "ResourceQuota status computed" quota_counted "$ns"

say "two one-GPU pods fit the quota and run"
gpu_pod "$ns" q-1 1
gpu_pod "$ns" q-2 1
until_true 120 "q-1 Running" pod_phase_is "$ns" q-1 Running
until_true 120 "q-2 Running" pod_phase_is "$ns" q-2 Running

say "a third is refused by the API server with its quota message"
out="$(gpu_pod "$ns" q-3 1 2>&1 || true)"
grep -q 'exceeded quota' <<< "$out" || fail "a pod past the quota was not refused: $out"
echo "refused: $(echo "$out" | head -1)"

if grep -q ValidatingAdmissionPolicy "$work/quota.yaml"; then
  say "a container asking for two GPUs is refused by the per-container policy"
  kc delete pod -n "$ns" q-2 --wait=true --timeout=60s >/dev/null
  out="$(gpu_pod "$ns" q-big 2 2>&1 || true)"
  grep -qiE 'denied|forbidden|invalid' <<< "$out" || fail "a two-GPU container was admitted: $out"
  echo "refused: $(echo "$out" | head -1)"
fi
kc delete namespace "$ns" --wait=false >/dev/null
echo PASS
