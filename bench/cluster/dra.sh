#!/usr/bin/env bash
# DRA on the real cluster (issue 33, docs/dra.md): pod created -> Running with one claim from
# deploy/examples/dra (a whole GPU, a 20 GiB memory share, a MIG profile made at prepare), p50/p99
# over N pods of each, one at a time; NodePrepareResources as the real kubelet records it
# (dra_operations_duration_seconds) and the scheduler's DynamicResources plugin time per pod
# (scheduler_plugin_execution_duration_seconds). Uses a running cluster (testing/cluster/cluster.sh
# up) and leaves it as it was; otherwise brings one up and takes it down. Needs root and Go.
set -euo pipefail
: "${BUILD:?}" "${ROOT:?}"
if [ "$(id -u)" != 0 ] || ! PATH=/usr/local/go/bin:$PATH command -v go >/dev/null; then
  echo "bench cluster-dra: skipped (needs root and Go >= 1.26)"; exit 0
fi
export PATH=/usr/local/go/bin:$PATH
N="${CLUSTER_PODS:-50}"
cluster="$ROOT/testing/cluster/cluster.sh"
out="$(mktemp)"
own=""
"$cluster" status >/dev/null 2>&1 || { own=1; "$cluster" up --build "$BUILD" >/dev/null; }
eval "$("$cluster" env)"
node="$GPULET_CLUSTER_NODE"
overlay="$ROOT/testing/cluster/overlays/sim-dgx-h100-dra"
root="$GPULET_CLUSTER_RUN/driver-root"
spec=/var/run/cdi/gpulet-bench-nvidia.json
finish() {
  kubectl delete namespace bench-dra --ignore-not-found --wait=true --timeout=120s >/dev/null 2>&1 || true
  kubectl delete -k "$overlay" --wait=true --timeout=120s >/dev/null 2>&1 || true
  kubectl label node "$node" gpulet.io/dra- >/dev/null 2>&1 || true
  rm -f "$spec" "$out" "$out.md"
  [ -z "$own" ] || "$cluster" down >/dev/null 2>&1 || true
}
trap finish EXIT
"$ROOT/testing/cluster/sim_cdi_spec.py" --build "$BUILD" --fixture-name dgx-h100 --driver-root "$root" --out "$spec"
kubectl label node "$node" nvidia.com/gpu.present=true gpulet.io/dra=true --overwrite >/dev/null
kubectl apply -k "$overlay" >/dev/null 2>&1
kubectl -n gpulet-system rollout status daemonset/gpulet-dra --timeout=180s >/dev/null
kubectl create namespace bench-dra >/dev/null
until kubectl get serviceaccount -n bench-dra default >/dev/null 2>&1; do sleep 0.2; done
until [ "$(kubectl get resourceslices --field-selector "spec.nodeName=$node" -o name | wc -l)" -gt 0 ]; do
  sleep 0.2  # the node's slices published
done

metrics() {  # metrics kubelet|scheduler: the component's Prometheus text
  case "$1" in
    kubelet) kubectl get --raw "/api/v1/nodes/$node/proxy/metrics";;
    # The scheduler's serving certificate is its own self-signed one (loopback only): -k; the
    # client certificate is the cluster admin's.
    scheduler) curl -sk --cert "$GPULET_CLUSTER_BASE/pki/admin.crt" --key "$GPULET_CLUSTER_BASE/pki/admin.key" \
                 https://127.0.0.1:10259/metrics;;
  esac
}
sum_of() {  # sum_of TEXT SERIES FILTER [EXCLUDE]: the summed values of SERIES lines containing FILTER
  awk -v n="$2" -v f="$3" -v x="${4:-@none@}" '$1 ~ "^"n"[{]" && index($1, f) && !index($1, x) {s += $2}
    END {printf "%.6f\n", s}' <<< "$1"
}
snapshot() {  # "<prepare sum> <prepare count> <plugin sum> <sampled cycles> <attempt sum> <attempts>"
  local k s h=scheduler_plugin_execution_duration_seconds a=scheduler_scheduling_attempt_duration_seconds
  k="$(metrics kubelet)"; s="$(metrics scheduler)"
  echo "$(sum_of "$k" dra_operations_duration_seconds_sum 'operation_name="PrepareResources"')" \
       "$(sum_of "$k" dra_operations_duration_seconds_count 'operation_name="PrepareResources"')" \
       "$(sum_of "$s" ${h}_sum 'plugin="DynamicResources"' PreEnqueue)" \
       "$(sum_of "$s" ${h}_count 'extension_point="Reserve",plugin="DynamicResources"')" \
       "$(sum_of "$s" ${a}_sum 'result="scheduled"')" "$(sum_of "$s" ${a}_count 'result="scheduled"')"
}
declare -A p50 p99 lo hi
run_kind() {  # run_kind EXAMPLE POD
  local ms=() a b i
  for i in $(seq 1 "$N"); do
    a=$(date +%s%N)
    python3 "$ROOT/tests/cluster/example_pods.py" "$ROOT/deploy/examples/dra/$1.yaml" bench-dra | kubectl create -f - >/dev/null
    kubectl wait -n bench-dra --for=jsonpath='{.status.phase}'=Running "pod/$2" --timeout=120s >/dev/null
    b=$(date +%s%N)
    ms+=($(( (b - a) / 1000000 )))
    kubectl delete -n bench-dra pod "$2" --wait=true --timeout=60s >/dev/null
    kubectl delete -n bench-dra resourceclaimtemplate "$1" --wait=true >/dev/null
  done
  local sorted; sorted="$(printf '%s\n' "${ms[@]}" | sort -n)"
  p50[$1]="$(awk -v p=50 '{v[NR]=$1} END {i=int((NR*p+99)/100); print v[i]}' <<< "$sorted")"
  p99[$1]="$(awk -v p=99 '{v[NR]=$1} END {i=int((NR*p+99)/100); print v[i]}' <<< "$sorted")"
  lo[$1]="$(head -1 <<< "$sorted")"; hi[$1]="$(tail -1 <<< "$sorted")"
}
m0="$(snapshot)"
for kind in one-gpu memory-share-20gi mig-1g; do run_kind "$kind" "$kind"; done
m1="$(snapshot)"
per() {  # per SUM_FIELD COUNT_FIELD: the mean between the two snapshots, in ms
  awk -v a="$m0" -v b="$m1" -v i="$1" -v j="$2" 'BEGIN {split(a, x, " "); split(b, y, " ");
    n = y[j] - x[j]; if (n > 0) printf "%.1f ms (mean of %d)", 1000 * (y[i] - x[i]) / n, n; else print "not recorded"}'
}
{
  echo "## Real cluster: DRA claims, pod start, kubelet prepare, scheduler time (issue 33)"
  echo
  echo "Kubernetes $(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'),"
  echo "one node, simulated DGX H100, gpulet's DRA driver deployed with \`kubectl apply -k"
  echo "testing/cluster/overlays/sim-dgx-h100-dra\`, the node's nvidia.com/gpu CDI spec present."
  echo "$N pods of each example, one at a time (each with its claim from the example's template),"
  echo "client-side \`kubectl create\` to \`kubectl wait\` seeing Running (two kubectl start-ups, about"
  echo "0.1 s, included). Machine: $(nproc) cores, $(date -u +%Y-%m-%d), load average at the end"
  echo "$(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine stretches the pod times; the"
  echo "kubelet's and the scheduler's own figures are less affected)."
  echo
  echo "| claim (deploy/examples/dra) | p50 | p99 | min / max |"
  echo "|---|---|---|---|"
  for kind in one-gpu memory-share-20gi mig-1g; do
    echo "| $kind | ${p50[$kind]} ms | ${p99[$kind]} ms | ${lo[$kind]} / ${hi[$kind]} ms |"
  done
  echo
  echo "| figure | value |"
  echo "|---|---|"
  echo "| kubelet \`dra_operations_duration_seconds{operation_name=\"PrepareResources\"}\` (NodePrepareResources, gpulet's side included) | $(per 1 2) |"
  echo "| kube-scheduler: DynamicResources plugin time per scheduling cycle (\`scheduler_plugin_execution_duration_seconds\`, every extension point but PreEnqueue, per sampled cycle that reached Reserve) | $(per 3 4) |"
  echo "| kube-scheduler: scheduling attempt, scheduled (\`scheduler_scheduling_attempt_duration_seconds\`) | $(per 5 6) |"
} > "$out.md"
cat "$out.md"
python3 "$ROOT/bench/update_section.py" cluster-dra "$out.md"
