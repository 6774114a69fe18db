#!/usr/bin/env bash
# The DRA driver on the simulated DGX A100 (issue 33, item 1: slices for the A100 node too), where
# GPUs 0 and 1 already hold a static MIG layout made outside DRA: kube-apiserver accepts the
# node's slices; they publish the six other GPUs whole, as memory shares and as MIG placements,
# and nothing of GPUs 0 and 1 (their instances are not DRA's to hand out, nor is the whole GPU
# beside them); a mig-1g.5gb claim from the shipped DeviceClass is allocated by kube-scheduler and
# its instance made on one of the six at prepare. The overlay is removed at the end.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-dra-a100
a100="$repo/testing/cluster/overlays/sim-dgx-a100-dra"
finish() {
  kc delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  kc delete -k "$a100" --wait=true --timeout=120s >/dev/null 2>&1 || true
  kc label node "$node" gpulet.io/dra- >/dev/null 2>&1 || true
}
trap finish EXIT

fresh_namespace "$ns"
kc label node "$node" nvidia.com/gpu.present=true gpulet.io/dra=true --overwrite >/dev/null
kc apply -k "$a100" >/dev/null 2>&1 || kc apply -k "$a100"
kc -n gpulet-system rollout status daemonset/gpulet-dra --timeout=180s >/dev/null || fail "gpulet-dra not ready"
census() {  # "<whole GPUs> <shares> <MIG placements> <devices of GPUs 0 and 1>" in the node's slices
  kc get resourceslices --field-selector "spec.nodeName=$node" -o json | python3 -c '
import json, sys
n = {"gpu": 0, "memory-share": 0, "mig": 0}
static = 0
for s in json.load(sys.stdin)["items"]:
    for d in s["spec"].get("devices", []):
        t = d.get("attributes", {}).get("type", {}).get("string")
        n[t] = n.get(t, 0) + 1
        if d["name"].split("-")[1] in ("0", "1"):
            static += 1
print(n["gpu"], n["memory-share"], n["mig"], static)'
}
six() { [ "$(census | cut -d" " -f1)" = 6 ]; }
until_true 60 "the A100 node's slices list six whole GPUs" six
read -r gpus shares migs static <<< "$(census)"
echo "published: $gpus GPUs, $shares memory shares, $migs MIG placements; devices of GPUs 0-1: $static"
[ "$shares" = 6 ] && [ "$static" = 0 ] && [ "$migs" -gt 0 ] \
  || fail "want 6 shares, MIG placements, and nothing of the statically partitioned GPUs 0 and 1"

say "a mig-1g.5gb claim: allocated by kube-scheduler, its instance made on one of the six at prepare"
python3 "$(dirname "$0")/example_pods.py" "$repo/deploy/examples/dra/mig-1g.yaml" "$ns" | \
  sed 's/mig-1g.10gb.gpulet.io/mig-1g.5gb.gpulet.io/' | kc apply -f - >/dev/null
until_true 120 "mig-1g Running" pod_phase_is "$ns" mig-1g Running
until_true 30 "mig-1g printed its /dev" logs_have "$ns" mig-1g '^DEV:'
devices="$(kc logs -n "$ns" mig-1g | sed -n 's/^GPULET_DRA_DEVICES=//p')"
[[ "$devices" =~ ^gpu-[2-7]-mig-1g-5gb-[0-9]+=MIG- ]] || fail "mig-1g: GPULET_DRA_DEVICES '$devices', want a 1g.5gb instance of GPUs 2-7"
[ "$(kc exec -n "$ns" mig-1g -- ls /dev/nvidia-caps | wc -w)" = 2 ] || fail "mig-1g: not exactly two capability nodes"
echo "mig-1g: $devices"
echo PASS
