#!/usr/bin/env bash
# gpulet's shipped RBAC on the real API server (issue 32, item 8): enough for everything the agent
# does (its running pod logs no refusal), and no more (writes outside it are refused with 403).
# Runs after cluster_device_plugin, with the agent deployed.
source "$(dirname "$0")/lib.sh"
sa=system:serviceaccount:gpulet-system:gpulet

# A fresh agent pod from the shipped manifests, so that its log holds only this run's calls.
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
kc delete pods -n gpulet-system -l app.kubernetes.io/component=node --wait=true --timeout=60s >/dev/null
kc -n gpulet-system rollout status daemonset/gpulet --timeout=120s >/dev/null || fail "gpulet DaemonSet not ready"
until_true 60 "allocatable 8" allocatable_is 8

say "what the agent's ServiceAccount may do, as the real RBAC authorizer answers"
can() { kc auth can-i "$@" --as="$sa" >/dev/null 2>&1; }
for ok in "get nodes" "watch nodes" "get configmaps -n gpulet-system" "watch configmaps -n gpulet-system" \
          "create configmaps -n gpulet-system" "patch configmaps -n gpulet-system"; do
  # shellcheck disable=SC2086
  can $ok || fail "the agent may not '$ok', which its code does"
done
for no in "patch nodes" "update nodes" "delete nodes" "list secrets -A" "get secrets -n gpulet-system" \
          "create pods -n gpulet-system" "create configmaps -n default" "delete configmaps -n gpulet-system" \
          "create resourceslices.resource.k8s.io"; do
  # shellcheck disable=SC2086
  can $no && fail "the agent may '$no', which no code of it needs"
done

say "a write outside the roles, with the agent's own token, is refused with 403"
token="$(kc create token gpulet -n gpulet-system --duration=10m)"
code="$(curl -s -o /tmp/gpulet-rbac-body.$$ -w '%{http_code}' --cacert "$GPULET_CLUSTER_BASE/pki/ca.crt" \
  -H "Authorization: Bearer $token" -H 'Content-Type: application/merge-patch+json' -X PATCH \
  --data '{"metadata":{"labels":{"gpulet.io/test":"x"}}}' "$GPULET_CLUSTER_API/api/v1/nodes/$node")"
body="$(cat /tmp/gpulet-rbac-body.$$)"; rm -f /tmp/gpulet-rbac-body.$$
[ "$code" = 403 ] || fail "patching the node with the agent's token answered $code: $body"
grep -qE '"reason": *"Forbidden"' <<< "$body" || fail "the 403 is not a Forbidden Status: $body"

say "the running agent met no refusal from the API server"
until_true 60 "the agent pod Ready" agent_ready
pod="$(agent_pod)"
logs="$(kc logs -n gpulet-system "$pod" --all-containers)"
if grep -qiE 'forbidden|\b403\b' <<< "$logs"; then
  fail "the agent was refused: $(grep -iE 'forbidden|\b403\b' <<< "$logs" | head -5)"
fi
say "without its config role the agent says so, naming the refusal, and backs off instead of spinning"
overlay="$repo/testing/cluster/overlays/sim-dgx-h100"
kc delete rolebinding -n gpulet-system gpulet-config >/dev/null
kc delete pod -n gpulet-system "$pod" --wait=true --timeout=60s >/dev/null
new_pod() { kc get pods -n gpulet-system -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
sync_log() { kc logs -n gpulet-system "$(new_pod)" -c config-sync 2>/dev/null; }
refusals() { grep -E 'HTTP 403' <<< "$(sync_log)" | grep -oE 'retry_ms=[0-9]+' | cut -d= -f2; }
backed_off() { [ "$(refusals | tail -1)" -ge 4000 ] 2>/dev/null; }
until_true 90 "config-sync's refused watch retried with a growing delay (to 4 s)" backed_off
line="$(grep -E 'HTTP 403' <<< "$(sync_log)" | head -1)"
echo "config-sync said: $line"
grep -q 'configmaps' <<< "$line" || fail "the refusal does not name what was refused: $line"
grep -q 'RBAC' <<< "$line" || fail "the refusal does not point at gpulet's RBAC: $line"
delays="$(refusals | tr '\n' ' ')"
echo "retry delays (ms): $delays"
sorted="$(refusals | sort -n | tr '\n' ' ')"
[ "$delays" = "$sorted" ] || fail "retries did not back off: $delays"
kc apply -k "$overlay" >/dev/null 2>&1
kc delete pod -n gpulet-system "$(new_pod)" --wait=true --timeout=60s >/dev/null
kc -n gpulet-system rollout status daemonset/gpulet --timeout=180s >/dev/null || fail "the agent did not recover with its role back"
until_true 60 "the agent pod Ready with the role back" agent_ready
until_true 60 "allocatable 8 with the role back" allocatable_is 8
echo PASS
