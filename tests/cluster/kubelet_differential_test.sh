#!/usr/bin/env bash
# The kubelet harness (testing/kubelet) against the real kubelet (issue 32, item 9): one scenario,
# through both, and what gpulet's device plugin observes compared. The scenario: gpulet registers
# nvidia.com/gpu (8 GPUs of the simulated DGX H100), a container is given one GPU, the kubelet
# restarts, gpulet registers again. What gpulet observes is read from its own log: the plugin-side
# events (registered, list_and_watch_open with its device count, allocate with its device count,
# kubelet_gone, socket_missing, list_and_watch_closed) up to the second stream's opening, without
# times, sockets or pids, in two phases (before and after the first sign of the kubelet going), each sorted: within a
# phase the order is a race in both (the kubelet dials back while the registration is answered).
# The two
# sequences must be equal; a difference is a harness defect, fixed in the harness.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-kubelet-diff
out="$build/differential"
mkdir -p "$out"
events() {  # events < LOG: the plugin-side events of gpulet's log, normalized (see above)
  python3 -c '
import re, sys
keep = {"registered": [], "list_and_watch_open": ["devices"], "allocate": ["devices"],
        "kubelet_gone": [], "socket_missing": [], "list_and_watch_closed": []}
phases = [[]]
for line in sys.stdin:
    m = re.search(r"event=(\w+)", line)
    if not m or m.group(1) not in keep or "resource=nvidia.com/gpu" not in line:
        continue
    name = m.group(1)
    if name in ("kubelet_gone", "list_and_watch_closed", "socket_missing") and len(phases) == 1:
        phases.append([])
    fields = []
    for f in keep[name]:
        v = re.search(f + r"=([^\s\"\\]+)", line)
        fields.append(f + "=" + (v.group(1) if v else "?"))
    phases[-1].append(" ".join([name] + fields))
    # Done once the plugin is registered and streaming again after the restart.
    if len(phases) == 2 and any(e.startswith("registered") for e in phases[1]) and \
            any(e.startswith("list_and_watch_open") for e in phases[1]):
        break
for i, p in enumerate(phases):
    for e in sorted(p):
        print("phase%d %s" % (i + 1, e))'
}

say "the harness: gpulet node against testing/kubelet, one allocation, one kubelet restart"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/dp"
"$build/gpulet" --simulate dgx-h100 --sim-state "$tmp/sim" node --device-plugin-path "$tmp/dp" \
  -a 127.0.0.1:0 > "$tmp/node.log" 2>&1 &
agent=$!
"$build/bin/gpulet-kubelet-harness" --dir "$tmp/dp" --expect 8 --allocate 1 --timeout 30 \
  --watch --restart-every 4 --restart-downtime 2.5 --duration 8 > "$tmp/harness.log" 2>&1 || { cat "$tmp/harness.log"; fail "the harness run failed"; }
kill -TERM "$agent"; wait "$agent" || true  # its log complete once it has exited
events < "$tmp/node.log" > "$out/kubelet-harness.events"

say "the real kubelet: the deployed agent, a pod given one GPU, the kubelet restarted"
kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
until_true 180 "allocatable nvidia.com/gpu: 8" allocatable_is 8
# A fresh agent, so that its log starts at its registration.
kc delete pods -n gpulet-system -l app.kubernetes.io/component=node --wait=true --timeout=60s >/dev/null
until_true 120 "the agent pod Ready" agent_ready
pod="$(agent_pod)"
until_true 60 "the agent registered" grep -q 'event=registered resource=nvidia.com/gpu' <<< "$(kc logs -n gpulet-system "$pod" -c gpulet)"
fresh_namespace "$ns"
gpu_pod "$ns" diff-0 1
until_true 120 "diff-0 Running" pod_phase_is "$ns" diff-0 Running
count() { grep -c "event=$1 resource=nvidia.com/gpu" <<< "$(kc logs -n gpulet-system "$pod" -c gpulet)" || true; }
before_r="$(count registered)"; before_l="$(count list_and_watch_open)"
"$repo/testing/cluster/cluster.sh" restart kubelet >/dev/null
registered_again() { [ "$(count registered)" -gt "$before_r" ] && [ "$(count list_and_watch_open)" -gt "$before_l" ]; }
until_true 120 "gpulet registered again after the kubelet's restart" registered_again
kc logs -n gpulet-system "$pod" -c gpulet | events > "$out/kubelet-real.events"
kc delete namespace "$ns" --wait=true --timeout=120s >/dev/null

say "what gpulet observed: harness vs real kubelet"
paste -d'|' "$out/kubelet-harness.events" "$out/kubelet-real.events" | sed 's/|/   |   /'
if ! diff -u "$out/kubelet-harness.events" "$out/kubelet-real.events"; then
  fail "gpulet observed the harness and the real kubelet differently (transcripts in $out)"
fi
[ "$(wc -l < "$out/kubelet-real.events")" -ge 5 ] || fail "too few events to compare: $(cat "$out/kubelet-real.events")"
echo PASS
