#!/usr/bin/env bash
# The fake API server (testing/apiserver) against the real kube-apiserver (issue 32 item 9): one
# scenario (testing/apiserver/api_differential.cc: creates, gets, merge/strategic/JSON patches,
# conflicts, validation, selectors, pages, watches with their ADDED/DELETED conversions, leases,
# nodes and their /status, ResourceSlices, binding, eviction under budgets) run with gpulet's own
# client through the stand-in and through the real server of cluster instance 3 (the fixture in
# run_fixture.sh). The two transcripts must be the same line for line: a difference is a stand-in
# defect, fixed in testing/apiserver (docs/real-cluster.md, "Stand-ins checked against the real
# components").
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || missing "needs root"
driver="${GPULET_BUILD_DIR:?GPULET_BUILD_DIR (the build directory) is not set}/bin/api-differential"
[ -x "$driver" ] || missing "$driver not built (ninja api-differential)"
eval "$("$repo/testing/cluster/cluster.sh" env)"
[ -r "${KUBECONFIG:-}" ] || { echo "FAIL: no kubeconfig for instance 3 (is the fixture up?)" >&2; exit 1; }

out="$GPULET_BUILD_DIR/differential"
mkdir -p "$out"
echo "--- the scenario through the real kube-apiserver ($GPULET_CLUSTER_API)"
timeout 120 "$driver" --kubeconfig "$KUBECONFIG" > "$out/apiserver.real.txt" \
  || { echo "FAIL: the scenario did not complete on the real server (rc $?)" >&2; tail -5 "$out/apiserver.real.txt" >&2; exit 1; }
echo "--- the scenario through the fake API server"
timeout 120 "$driver" --fake > "$out/apiserver.fake.txt" \
  || { echo "FAIL: the scenario did not complete on the fake (rc $?)" >&2; tail -5 "$out/apiserver.fake.txt" >&2; exit 1; }

steps="$(grep -c '^== ' "$out/apiserver.real.txt" || true)"
[ "$steps" -ge 60 ] || { echo "FAIL: only $steps steps in the real transcript" >&2; exit 1; }
if ! diff -u "$out/apiserver.real.txt" "$out/apiserver.fake.txt"; then
  echo "FAIL: the fake API server differs from kube-apiserver (- real, + fake): a stand-in defect," \
       "to fix in testing/apiserver; transcripts in $out" >&2
  exit 1
fi
echo "PASS: $steps steps, the fake and kube-apiserver answer gpulet alike"
