#!/usr/bin/env bash
# The real kube-scheduler at fleet scale (issue 34 item 5): 1,000 and 5,000 nodes of 8 GPUs that
# exist only in the API server (testing/cluster/k8s/fleet keeps them Ready: Leases renewed, status
# and gpulet-memory ConfigMaps current), on a control-plane-only cluster (instance 2, so it never
# meets the tests' instance 1). For each fleet size: scheduler throughput (pods/s) and per-pod
# latency created -> bound (from a watch), p50/p99, for whole-GPU pods (nvidia.com/gpu: 1) and
# memory-sized pods (gpulet.io/gpu-memory-1gi: 20), with the scheduler's defaults (no extender) and
# with gpulet's extender configured as deploy/extender ships it (mutual TLS, --policy=bestfit).
# Then the allocation ratio the real scheduler reaches with the extender's FGD policy on the openb
# trace's pods, beside `gpulet replay` on the same pods and nodes (replay_section below).
# Needs root and Go (as the cluster tier); skipped otherwise.
#   FLEET_SIZES="1000 5000" (empty: none)  FLEET_PODS=1000
#   FLEET_REPLAY_NODES=300 (0: no comparison)  FLEET_REPLAY_POLICY=fgd  FLEET_REPLAY_SEED=42
#   TRACE_DIR=../shared/traces/alibaba-openb
set -euo pipefail
: "${BUILD:?}" "${ROOT:?}"
if [ "$(id -u)" != 0 ] || ! PATH=/usr/local/go/bin:$PATH command -v go >/dev/null; then
  echo "bench fleet: skipped (needs root and Go >= 1.26)"; exit 0
fi
export PATH=/usr/local/go/bin:$PATH GPULET_FLEET_INSTANCE=2
sizes="${FLEET_SIZES-1000 5000}"
replay_nodes="${FLEET_REPLAY_NODES:-300}"
replay_policy="${FLEET_REPLAY_POLICY:-fgd}"
replay_seed="${FLEET_REPLAY_SEED:-42}"
trace_dir="${TRACE_DIR:-$ROOT/../shared/traces/alibaba-openb}"
pods="${FLEET_PODS:-1000}"
source "$ROOT/tests/cluster_fleet/lib.sh"
out="$(mktemp)"
trap 'fleet_cluster_down >/dev/null 2>&1 || true; rm -f "$out" "$out.md" "$out.replay.md"' EXIT
t0=$SECONDS
fleet_cluster_up "$BUILD"
echo "bench fleet: control plane and extender up in $((SECONDS - t0)) s" >&2

rows=()
for n in $sizes; do
  # A 5,000-node fleet renews its Leases every 30 s (the kubelet: 10 s), within the node lifecycle
  # controller's 50 s grace, so that 500 Lease writes a second do not take the 2-core machine.
  renew=10s; [ "$n" -gt 1000 ] && renew=30s
  t1=$SECONDS
  start_bg "fleet-$n" "$state/fleet" nodes -count "$n" -prefix "f$n-" -lease-renew "$renew" -workers 32 \
    -ready-file "$state/f$n.ready"
  wait_file 1200 "$state/f$n.ready" "fleet-$n"
  made=$((SECONDS - t1))
  echo "bench fleet: $n nodes Ready in $made s" >&2
  for ext in 0 1; do
    use_scheduler "$ext"
    for kind in gpu memory; do
      amount=1; sched=default-scheduler
      [ "$kind" = memory ] && { amount=20; sched=gpulet-memory; }
      r="$("$state/fleet" pods -count "$pods" -kind "$kind" -amount "$amount" -scheduler "$sched" \
        -node-selector "gpulet.io/fleet=f$n" -namespace bench-fleet -workers 16 -timeout 600s)"
      echo "bench fleet: nodes=$n extender=$ext $r" >&2
      rows+=("$n $ext $kind $(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["pods_per_second"], r["p50_ms"], r["p99_ms"], r["bound"], r["pods"], r["create_seconds"])' "$r")")
    done
  done
  stop_bg "fleet-$n"
  rows+=("made $n $made")
done

# replay_section: the openb trace's one-GPU arrivals (the seed's, arriving until 130 % of the first
# $replay_nodes GPU nodes' capacity, as `gpulet extender replay --compare-placements` takes them)
# placed by the real kube-scheduler with the extender's policy, one pod at a time, beside the
# replay's placements of the same pods on the same nodes (section fleet-replay).
replay_section() {
  local setup="$state/replay-setup.json" cmp r t1=$SECONDS
  if [ ! -f "$trace_dir/openb_node_list_gpu_node.csv" ]; then
    echo "bench fleet: no openb trace at $trace_dir; the replay comparison is skipped" >&2; return 0
  fi
  cmp="$("$BUILD/gpulet" extender replay --compare-placements --policy "$replay_policy" --seed "$replay_seed" \
    --nodes "$replay_nodes" --trace-dir "$trace_dir" --export "$setup")" || fleet_die "gpulet extender replay: $cmp"
  echo "bench fleet: $cmp" >&2
  # The extender as the comparison needs it: the policy, the trace as its workload; the exported
  # objects are published once, so neither they nor the reservations may age out during the run.
  start_extender "$BUILD" --policy="$replay_policy" --workload "$trace_dir/openb_pod_list_default.csv" \
    --stale-after 24h --reservation-timeout 24h
  scheduler_config 1 "$state/scheduler-replay.yaml" gpulet.io/gpu-memory-milli
  use_scheduler "$state/scheduler-replay.yaml"
  start_bg fleet-replay "$state/fleet" nodes -setup "$setup" -prefix replay- -ready-file "$state/replay.ready"
  wait_file 600 "$state/replay.ready" fleet-replay
  r="$("$state/fleet" replay -setup "$setup" -node-selector gpulet.io/fleet=replay -namespace bench-replay \
    -timeout 120s)" || fleet_die "fleet replay"
  echo "bench fleet: replay $r" >&2
  stop_bg fleet-replay
  python3 "$ROOT/bench/fleet/replay_table.py" "$r" "$cmp" "$replay_policy" "$replay_seed" "$replay_nodes" \
    "$((SECONDS - t1))" > "$out.replay.md"
  cat "$out.replay.md"
  python3 "$ROOT/bench/update_section.py" fleet-replay "$out.replay.md"
}

[ -n "$sizes" ] && {
  echo "## The real kube-scheduler at fleet scale, with and without gpulet's extender (issue 34)"
  echo
  echo "kube-scheduler v1.37.2 (upstream, built from its module) on a control-plane-only cluster"
  echo "(\`GPULET_CLUSTER_INSTANCE=2 testing/cluster/cluster.sh up --no-node\`); nodes of 8 GPUs"
  echo "(\`nvidia.com/gpu: 8\`, \`gpulet.io/gpu-memory-1gi: 640\`) that exist only in the API server"
  echo "(\`testing/cluster/k8s/fleet\`: Leases renewed, status and \`gpulet-memory-<node>\` ConfigMaps"
  echo "current; no kubelet, so bound pods never run). $pods pods per row, created by 16 client"
  echo "workers; latency is client-side, from the create call to the watch seeing \`spec.nodeName\`;"
  echo "throughput is pods bound / (last bind - first create). \"default\": the scheduler's own"
  echo "configuration, no extender. \"extender\": deploy/extender's KubeSchedulerConfiguration (the"
  echo "\`gpulet-memory\` profile without score plugins, \`percentageOfNodesToScore: 100\`, the extender"
  echo "with mutual TLS, filter + prioritize + bind, node-cache mode) and \`gpulet extender"
  echo "--policy=bestfit\` on 127.0.0.1; whole-GPU pods never reach it (\`managedResources\`). Memory"
  echo "pods ask 20 GiB. The machine is shared: the API server, etcd, the scheduler, the extender"
  echo "and the fleet client all run on its 2 cores."
  echo
  echo "**Read the pods/s with the scheduler's client limit in mind.** kube-scheduler's"
  echo "\`clientConnection.qps\` defaults to 50 (burst 100), and each bind it makes itself is one"
  echo "call: 1,000 pods take 100/burst + 900/50 = 18.0 s, the 55.4 pods/s of the first three rows"
  echo "to the decimal. With the extender, memory pods are bound by the extender (its own client,"
  echo "no such limit), and the filter, prioritize and bind round trips over mutual TLS are what"
  echo "bound them. The latencies are queueing-dominated: pods are created faster than the limit."
  echo "The scheduler's upstream figure (its scheduler_perf suite, 5,000 nodes) is measured with the"
  echo "limit raised."
  echo
  echo "| nodes | scheduler | pods | pods/s | p50 created -> bound | p99 | bound |"
  echo "|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    set -- $r
    [ "$1" = made ] && continue
    cfg=default; [ "$2" = 1 ] && cfg=extender
    what="whole GPU (\`nvidia.com/gpu: 1\`)"; [ "$3" = memory ] && what="20 GiB (\`gpulet.io/gpu-memory-1gi: 20\`)"
    printf '| %s | %s | %s | %.1f | %.0f ms | %.0f ms | %s/%s |\n' "$1" "$cfg" "$what" "$4" "$5" "$6" "$7" "$8"
  done
  echo
  for r in "${rows[@]}"; do
    set -- $r
    [ "$1" = made ] && echo "- $2 nodes (Node, status, Lease, ConfigMap each) created and Ready, untainted: $3 s"
  done
} > "$out.md" && cat "$out.md" && python3 "$ROOT/bench/update_section.py" fleet "$out.md"
[ "$replay_nodes" = 0 ] || replay_section
