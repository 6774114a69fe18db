#!/usr/bin/env bash
# The real kube-scheduler at fleet scale (issue 34 item 5): 1,000 and 5,000 nodes of 8 GPUs that
# exist only in the API server (testing/cluster/k8s/fleet keeps them Ready: Leases renewed, status
# and gpulet-memory ConfigMaps current), on a control-plane-only cluster (instance 2, so it never
# meets the tests' instance 1). For each fleet size and each scheduler client QPS: scheduler
# throughput (pods/s) and per-pod latency created -> bound (from a watch), p50/p99, for whole-GPU
# pods (nvidia.com/gpu: 1) and memory-sized pods (gpulet.io/gpu-memory-1gi: 20), with the
# scheduler's defaults (no extender) and with gpulet's extender configured as deploy/extender ships
# it (mutual TLS, --policy=bestfit). Then DRA claims at the sizes of FLEET_DRA_SIZES: one node's
# ResourceSlices as `gpulet dra` (this build, simulated DGX H100, as the cluster tier runs it)
# publishes them, cloned for every fleet node (`fleet slices`), and pods each with their own claim
# of deploy/examples/dra/one-gpu.yaml's template (claim + pod created -> bound, claim allocated).
# Then the allocation ratio the real scheduler reaches with the extender's FGD policy on the openb
# trace's pods, beside `gpulet replay` on the same pods and nodes (replay_section below).
# Needs root and Go (as the cluster tier); skipped otherwise.
#   FLEET_SIZES="1000 5000" (empty: none)  FLEET_PODS=1000
#   FLEET_QPS="50 500": kube-scheduler's clientConnection.qps (burst twice that) for each run;
#     upstream's default is 50, which bounds the binds the scheduler makes itself
#   FLEET_DRA_SIZES="1000": the fleet sizes (of FLEET_SIZES) that also get the DRA runs (empty: none)
#   FLEET_DRA_PODS=300 (the scheduler's DRA cycle is far dearer)  FLEET_DRA_CLAIM=deploy/examples/dra/one-gpu.yaml (its ResourceClaimTemplate)
#   FLEET_DOCS=1 (0: print the sections, leave docs/benchmarks.md as it is)
#   FLEET_RENDER=LOG: measure nothing; write the fleet section from the rows in LOG (this script's
#     stderr of earlier runs)
#   FLEET_REPLAY_NODES=300 (0: no comparison)  FLEET_REPLAY_POLICY=fgd  FLEET_REPLAY_SEED=42
#   TRACE_DIR=../shared/traces/alibaba-openb
set -euo pipefail
: "${BUILD:?}" "${ROOT:?}"
if [ "$(id -u)" != 0 ] || ! PATH=/usr/local/go/bin:$PATH command -v go >/dev/null; then
  echo "bench fleet: skipped (needs root and Go >= 1.26)"; exit 0
fi
export PATH=/usr/local/go/bin:$PATH GPULET_FLEET_INSTANCE=2
sizes="${FLEET_SIZES-1000 5000}"
qps_list="${FLEET_QPS:-50 500}"
dra_sizes="${FLEET_DRA_SIZES-1000}"
dra_claim="${FLEET_DRA_CLAIM:-$ROOT/deploy/examples/dra/one-gpu.yaml}"
docs="${FLEET_DOCS:-1}"
replay_nodes="${FLEET_REPLAY_NODES:-300}"
replay_policy="${FLEET_REPLAY_POLICY:-fgd}"
replay_seed="${FLEET_REPLAY_SEED:-42}"
trace_dir="${TRACE_DIR:-$ROOT/../shared/traces/alibaba-openb}"
pods="${FLEET_PODS:-1000}"
dra_pods="${FLEET_DRA_PODS:-300}"
source "$ROOT/tests/cluster_fleet/lib.sh"
out="$(mktemp)"

# scheduler_qps QPS: the instance's kube-scheduler configuration with clientConnection qps QPS and
# burst 2*QPS, taking effect at the next use_scheduler (its restart keeps these lines and rewrites
# only the appended part). cluster.sh writes the lines at `up` from GPULET_CLUSTER_SCHEDULER_QPS;
# the check fails the bench if their layout ever changes rather than measuring another limit.
scheduler_qps() {
  local f="$GPULET_CLUSTER_BASE/scheduler.yaml"
  sed -i -E "s/^  qps: .*/  qps: $1/; s/^  burst: .*/  burst: $((2 * $1))/" "$f"
  [ "$(grep -cxE "  qps: $1|  burst: $((2 * $1))" "$f")" = 2 ] || fleet_die "$f: clientConnection qps/burst not found"
}
load1() { cut -d' ' -f1 /proc/loadavg; }
# sched_algorithm: "<sum> <count>" of the instance's kube-scheduler's
# scheduler_scheduling_algorithm_duration_seconds (filter and score, the extender's calls included,
# per scheduling attempt; the bind and the client's rate limit are not in it). Its secure port is
# cluster.sh's, 10259 + 10 * instance; the admin's client certificate may read it.
sched_algorithm() {
  local m
  m="$(curl -sk --max-time 10 --cert "$GPULET_CLUSTER_BASE/pki/admin.crt" --key "$GPULET_CLUSTER_BASE/pki/admin.key" \
    "https://127.0.0.1:$((10259 + 10 * GPULET_CLUSTER_INSTANCE))/metrics")" || fleet_die "kube-scheduler /metrics"
  awk '$1 == "scheduler_scheduling_algorithm_duration_seconds_sum" {s = $2}
       $1 == "scheduler_scheduling_algorithm_duration_seconds_count" {c = $2} END {print s + 0, c + 0}' <<< "$m"
}

# dra_template: one node's ResourceSlices as gpulet's DRA driver publishes them, into
# $state/dra-slices.json. `gpulet dra` of this build with the cluster tier's simulated DGX H100
# (testing/cluster/overlays/sim-dgx-h100-dra: --simulate dgx-h100, the default memory unit and
# placement policy) runs as a host process against the instance's API server for a Node object
# without a kubelet (the publisher needs only the Node's uid, for the owner reference; the
# plugin's sockets go to a directory no kubelet watches) until it has published; its slices are
# read back, then it and the node are stopped and deleted (the slices go with the node).
dra_template() {
  local d="$state/dra" node=dra-template-00000 published
  mkdir -p "$d"/{sim,reg,plugins,cdi,driver,state,dp,mps}
  cat /proc/sys/kernel/random/boot_id > "$d/boot_id"
  start_bg dra-template-node "$state/fleet" nodes -count 1 -prefix dra-template- -memory-gpus 0 \
    -ready-file "$state/dra-template.ready"
  wait_file 120 "$state/dra-template.ready" dra-template-node
  start_bg dra "$BUILD/gpulet" dra --simulate dgx-h100 --sim-state "$d/sim" --node-name "$node" \
    --kubeconfig "$KUBECONFIG" --plugins-registry "$d/reg" --plugin-dir "$d/plugins" --cdi-root "$d/cdi" \
    --driver-root "$d/driver" --state-dir "$d/state" --boot-id-file "$d/boot_id" --device-plugin-path "$d/dp" \
    --mps-root "$d/mps"
  local end=$((SECONDS + 120))
  until published="$(sed -n "s/.*dra: published \([0-9]*\) ResourceSlices of pool $node .*/\1/p" "$state/logs/dra.log" | tail -1)" \
        && [ -n "$published" ]; do
    [ $SECONDS -lt $end ] || fleet_die "gpulet dra published no ResourceSlices for $node in 120 s"
    kill -0 "$(cat "$state/pids/dra")" 2>/dev/null || fleet_die "gpulet dra exited"
    sleep 0.5
  done
  kc get resourceslices --field-selector "spec.nodeName=$node" -o json > "$d/slices.json"
  [ "$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["items"]))' "$d/slices.json")" = "${published%% *}" ] \
    || fleet_die "read back other than the $published slices gpulet dra published"
  stop_bg dra dra-template-node
  cp "$d/slices.json" "$state/dra-slices.json"
}

# run_pods N QPS CFG KIND: one row (FLEET_PODS pods of KIND on the N-node fleet) into rows.
rows=()
add_row() { rows+=("$1"); echo "bench fleet: row $1" >&2; }
run_pods() {
  local n="$1" qps="$2" cfg="$3" kind="$4" amount=1 sched=default-scheduler count="$pods" extra=() r
  case "$kind" in
    memory) amount=20; sched=gpulet-memory;;
    claim) count="$dra_pods"; extra=(-claim-template "$dra_claim");;
  esac
  local m0 m1
  m0="$(sched_algorithm)"
  r="$("$state/fleet" pods -count "$count" -kind "$kind" -amount "$amount" -scheduler "$sched" "${extra[@]}" \
    -node-selector "gpulet.io/fleet=f$n" -namespace bench-fleet -workers 16 -timeout 600s)"
  m1="$(sched_algorithm)"
  echo "bench fleet: nodes=$n qps=$qps $cfg $r algorithm=[$m0]->[$m1] load=$(load1)" >&2
  add_row "$n $qps $cfg $kind $(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["pods_per_second"], r["p50_ms"], r["p99_ms"], r["bound"], r["pods"], r["create_seconds"], r.get("allocated", "-"))' "$r") $(load1) $(awk -v a="$m0" -v b="$m1" 'BEGIN {split(a, x, " "); split(b, y, " "); n = y[2] - x[2]; if (n > 0) printf "%.1f %d", 1000 * (y[1] - x[1]) / n, n; else print "- 0"}')"
}

# write_section: the fleet section from the rows so far (rewritten after each fleet size, so a run
# cut short keeps what it measured).
write_section() {
  local r what algo_col=""
  for r in "${rows[@]}"; do set -- $r; [ -z "${13:-}" ] || algo_col=1; done
  {
    echo "## The real kube-scheduler at fleet scale, with and without gpulet's extender, and DRA claims (issue 34)"
    echo
    echo "kube-scheduler v1.37.2 (upstream, built from its module) on a control-plane-only cluster"
    echo "(\`GPULET_CLUSTER_INSTANCE=2 testing/cluster/cluster.sh up --no-node\`); nodes of 8 GPUs"
    echo "(\`nvidia.com/gpu: 8\`, \`gpulet.io/gpu-memory-1gi: 640\`) that exist only in the API server"
    echo "(\`testing/cluster/k8s/fleet\`: Leases renewed, status and \`gpulet-memory-<node>\` ConfigMaps"
    echo "current; no kubelet, so bound pods never run). $pods pods per row ($dra_pods with claims), created"
    echo "by 16 client workers; latency is client-side, from the create call (of the claim, for DRA) to"
    echo "the watch seeing \`spec.nodeName\`; throughput is pods bound / (last bind - first create)."
    echo "\"default\": the scheduler's own configuration, no extender. \"extender\": deploy/extender's"
    echo "KubeSchedulerConfiguration (the \`gpulet-memory\` profile without score plugins,"
    echo "\`percentageOfNodesToScore: 100\`, the extender with mutual TLS, filter + prioritize + bind,"
    echo "node-cache mode) and \`gpulet extender --policy=bestfit\` on 127.0.0.1; whole-GPU pods never"
    echo "reach it (\`managedResources\`). In runs before 2026-12-05 21:45 UTC the shipped file's"
    echo "\`percentageOfNodesToScore: 100\` was top-level and so applied to the \`default-scheduler\`"
    echo "profile beside it too: every feasible node filtered and scored, where the default samples (10 %"
    echo "of 5,000 nodes, 42 % of 1,000); it is on the \`gpulet-memory\` profile now (at 5,000 nodes and"
    echo "QPS 500 the \"extender\" whole-GPU row went from 20.5 to 88.2 pods/s, the same as the default's"
    echo "within this machine's create rate). The \`gpulet-memory\` profile itself still filters and scores"
    echo "every node, as the replay does: at 5,000 nodes likely most of its per-attempt time (the extender's own filter + prioritize: 1.4 ms in bench/extender). Memory pods ask 20 GiB."
    echo "\"QPS\": the scheduler's"
    echo "\`clientConnection.qps\` (burst twice that; upstream's default 50). The machine is shared: the"
    echo "API server, etcd, the scheduler, the extender and the fleet client all run on its 2 cores,"
    echo "beside other work (the load column: 1-minute load average at the end of the row). \"created"
    echo "in\": how long the 16 workers took to create the row's pods (and claims), the API server's"
    echo "write rate on this machine."
    [ -z "$algo_col" ] || {
      echo "\"algorithm per attempt\": the scheduler's own time in filter and score per scheduling"
      echo "attempt, the extender's calls included, the bind and the client's rate limit not"
      echo "(\`scheduler_scheduling_algorithm_duration_seconds\`, mean over the row's attempts, their"
      echo "number in parentheses)."
    }
    echo
    echo "**Read the QPS-50 rows with the scheduler's client limit in mind.** Each bind the scheduler"
    echo "makes itself is one call: 1,000 pods take 100/burst + 900/50 = 18.0 s, 55.4 pods/s. With the"
    echo "extender, memory pods are bound by the extender (its own client, no such limit), and the"
    echo "filter, prioritize and bind round trips over mutual TLS are what bound them. A DRA pod costs"
    echo "the scheduler two calls (the claim's allocation, then the bind). With the limit raised, a row"
    echo "whose pods/s is close to pods / \"created in\" is bound by how fast this shared machine's API"
    echo "server took the creates, not by the scheduler; where it stays well below (the extender's"
    echo "memory pods, DRA claims), the scheduling cycle is the bound. Upstream's scheduler_perf"
    echo "figures (5,000 nodes) are measured with the limit raised, on machines of many more cores."
    echo
    if [ -n "$algo_col" ]; then
      echo "| nodes | QPS | scheduler | pods | pods/s | p50 created -> bound | p99 | bound | created in | algorithm per attempt | load |"
      echo "|---|---|---|---|---|---|---|---|---|---|---|"
    else
      echo "| nodes | QPS | scheduler | pods | pods/s | p50 created -> bound | p99 | bound | created in | load |"
      echo "|---|---|---|---|---|---|---|---|---|---|"
    fi
    for r in "${rows[@]}"; do
      set -- $r
      [ "$1" = made ] || [ "$1" = slices ] && continue
      case "$4" in
        gpu) what="whole GPU (\`nvidia.com/gpu: 1\`)";;
        memory) what="20 GiB (\`gpulet.io/gpu-memory-1gi: 20\`)";;
        claim) what="DRA claim, \`$(basename "$dra_claim" .yaml)\` template";;
      esac
      local bound="$8/$9" algo="not recorded"
      [ "${11}" = - ] || bound="$bound, ${11} allocated"
      [ -z "${13:-}" ] || algo="${13} ms (${14})"
      printf '| %s | %s | %s | %s | %.1f | %.0f ms | %.0f ms | %s | %.1f s | %s%s |\n' "$1" "$2" "$3" "$what" "$5" "$6" "$7" "$bound" "${10}" \
        "${algo_col:+$algo | }" "${12}"
    done
    echo
    for r in "${rows[@]}"; do
      set -- $r
      [ "$1" = made ] && echo "- $2 nodes (Node, status, Lease, ConfigMap each) created and Ready, untainted: $3 s; load $4"
      [ "$1" = slices ] && echo "- $2 nodes' ResourceSlices published: $3 slices in $4 s; load $5"
    done
    if [ -n "$dra_slice_desc" ]; then
      echo
      echo "DRA rows: the ResourceSlices are gpulet's own. \`gpulet dra\` of this build, with the cluster"
      echo "tier's simulated DGX H100 (\`--simulate dgx-h100\`, the default memory unit and placement"
      echo "policy, as testing/cluster/overlays/sim-dgx-h100-dra runs it), ran as a host process against"
      echo "this API server for one Node object until it had published; its slices were read back"
      echo "and \`fleet slices\` cloned them for every fleet node: the object's name, \`spec.nodeName\`,"
      echo "the pool's name and the owner reference are the node's, the rest is gpulet's content"
      echo "(the clone is refused if the template node's name is left anywhere else). Per node:"
      echo "$dra_slice_desc. Each pod uses its own ResourceClaim (the spec of"
      echo "$(realpath --relative-to="$ROOT" "$dra_claim")'s ResourceClaimTemplate; DeviceClass"
      echo "\`gpu.gpulet.io\` from deploy/overlays/dra), claim then pod created by the same worker; the"
      echo "default profile (the extender manages no claims). \"allocated\": claims found with an"
      echo "allocation whose every result is from the pool of their pod's node."
    fi
    [ -z "$pending_note" ] || { echo; echo "$pending_note"; }
    [ -z "${FLEET_RENDER:-}" ] || { echo; echo "(Rendered again from the measuring runs' own logs, \`FLEET_RENDER\`, in the order they ran.)"; }
  } > "$out.md"
  cat "$out.md"
  [ "$docs" = 0 ] || python3 "$ROOT/bench/update_section.py" fleet "$out.md"
}

pending_note=""
dra_slice_desc=""
# FLEET_RENDER=LOG: no measurement; the section rendered again from the "bench fleet: row" and
# "bench fleet: dra-slices" lines of earlier runs' stderr (several runs' logs concatenated: all
# their rows, in that order).
if [ -n "${FLEET_RENDER:-}" ]; then
  trap 'rm -f "$out" "$out.md"' EXIT
  mapfile -t rows < <(sed -n 's/^bench fleet: row //p' "$FLEET_RENDER")
  dra_slice_desc="$(sed -n 's/^bench fleet: dra-slices //p' "$FLEET_RENDER" | tail -1)"
  [ ${#rows[@]} -gt 0 ] || fleet_die "$FLEET_RENDER: no \"bench fleet: row\" lines"
  write_section
  exit 0
fi
trap 'fleet_cluster_down >/dev/null 2>&1 || true; rm -f "$out" "$out.md" "$out.replay.md"' EXIT
t0=$SECONDS
# The first QPS from the start (cluster.sh writes it into the scheduler's configuration).
export GPULET_CLUSTER_SCHEDULER_QPS="${qps_list%% *}"
fleet_cluster_up "$BUILD"
echo "bench fleet: control plane and extender up in $((SECONDS - t0)) s" >&2
for n in $sizes; do
  # A 5,000-node fleet renews its Leases every 30 s (the kubelet: 10 s), within the node lifecycle
  # controller's 50 s grace, so that 500 Lease writes a second do not take the 2-core machine.
  renew=10s; [ "$n" -gt 1000 ] && renew=30s
  t1=$SECONDS
  start_bg "fleet-$n" "$state/fleet" nodes -count "$n" -prefix "f$n-" -lease-renew "$renew" -workers 32 \
    -ready-file "$state/f$n.ready"
  wait_file 2400 "$state/f$n.ready" "fleet-$n"
  made=$((SECONDS - t1))
  echo "bench fleet: $n nodes Ready in $made s (load $(load1))" >&2
  add_row "made $n $made $(load1)"
  for qps in $qps_list; do
    scheduler_qps "$qps"
    for ext in 0 1; do
      use_scheduler "$ext"
      cfg=default; [ "$ext" = 1 ] && cfg=extender
      for kind in gpu memory; do run_pods "$n" "$qps" "$cfg" "$kind"; done
    done
  done
  if [[ " $dra_sizes " == *" $n "* ]]; then
    [ -f "$state/dra-slices.json" ] || dra_template
    kc apply -f "$ROOT/deploy/overlays/dra/deviceclasses.yaml" >/dev/null
    s="$("$state/fleet" slices -template "$state/dra-slices.json" -fleet "f$n" -workers 16)" || fleet_die "fleet slices"
    echo "bench fleet: slices $s load=$(load1)" >&2
    add_row "slices $n $(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r["slices"], round(r["seconds"]))' "$s") $(load1)"
    dra_slice_desc="$(python3 -c 'import json,sys
r = json.loads(sys.argv[1]); t = json.load(open(sys.argv[2]))["items"]
kinds = {}
for s in t:
    for d in s["spec"].get("devices", []):
        k = d["attributes"]["type"]["string"]; kinds[k] = kinds.get(k, 0) + 1
print("%d slices (%d of counter sets), %d devices (%s), %.0f KiB of JSON" % (len(t),
      sum(1 for s in t if s["spec"].get("sharedCounters")), r["devices_per_node"],
      ", ".join("%d %s" % (v, k) for k, v in sorted(kinds.items())), r["bytes_per_node"] / 1024))' "$s" "$state/dra-slices.json")"
    echo "bench fleet: dra-slices $dra_slice_desc" >&2
    for qps in $qps_list; do
      scheduler_qps "$qps"
      use_scheduler 0
      run_pods "$n" "$qps" default claim
    done
    # Deleted here at the fleet client's rate (the garbage collector would, once the nodes are
    # gone, at kube-controller-manager's 20 requests/s while it lifts the next fleet's taints).
    "$state/fleet" slices -template "$state/dra-slices.json" -fleet "f$n" -delete >/dev/null || fleet_die "fleet slices -delete"
  fi
  stop_bg "fleet-$n"
  rest="${sizes#*$n}"
  pending_note=""
  [ -z "${rest// }" ] || pending_note="Not measured in this run yet: fleet sizes$rest."
  write_section
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
  scheduler_qps "${qps_list%% *}"
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
  [ "$docs" = 0 ] || python3 "$ROOT/bench/update_section.py" fleet-replay "$out.replay.md"
}

[ "$replay_nodes" = 0 ] || replay_section
