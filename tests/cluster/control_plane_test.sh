#!/usr/bin/env bash
# The real control plane enforces what gpulet's manifests rely on: authentication, RBAC with the
# Node authorizer, NodeRestriction, and resource.k8s.io/v1 served.
source "$(dirname "$0")/lib.sh"

say "the node registered by the real kubelet is Ready"
kc wait --for=condition=Ready "node/$node" --timeout=60s >/dev/null || fail "node $node not Ready"

say "an anonymous client is refused"
code="$(curl -s -o /dev/null -w '%{http_code}' --cacert "$GPULET_CLUSTER_BASE/pki/ca.crt" \
  "$GPULET_CLUSTER_API/api/v1/namespaces/kube-system/secrets")"
[ "$code" = 401 ] || [ "$code" = 403 ] || fail "anonymous list of secrets answered $code"

say "resource.k8s.io/v1 is served (DeviceClass, ResourceClaim, ResourceSlice)"
served="$(kc api-resources --api-group=resource.k8s.io -o name)"
for r in deviceclasses resourceclaims resourceslices resourceclaimtemplates; do
  grep -qx "$r.resource.k8s.io" <<< "$served" || fail "$r not served: $served"
done
grep -q '"resourceslices"' <<< "$(kc get --raw /apis/resource.k8s.io/v1)" || fail "resource.k8s.io/v1 lacks resourceslices"

say "NodeRestriction: the node's own identity cannot label another node"
other=gpulet-test-other-node
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata: {name: $other}
YAML
out="$(kubectl --kubeconfig "$GPULET_CLUSTER_BASE/kubelet.kubeconfig" label node "$other" x=y 2>&1 || true)"
kc delete node "$other" --wait=false >/dev/null
grep -qi 'forbidden' <<< "$out" || fail "the kubelet's identity labelled another node: $out"

say "RBAC: a ServiceAccount without roles cannot list pods"
kc auth can-i list pods --as=system:serviceaccount:default:default -A >/dev/null 2>&1 \
  && fail "default ServiceAccount may list pods cluster-wide"
echo PASS
