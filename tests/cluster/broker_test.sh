#!/usr/bin/env bash
# The broker on the real node (issue 34, item 3): real Slurm (Debian 12's slurmctld and one slurmd
# named after the Kubernetes node, started as tests/slurm/slurm_cluster.sh starts them) and the
# real API server, kubelet and scheduler. Two `gpulet broker run` replicas as host processes, with
# a token of the ServiceAccount that deploy/broker ships and its RBAC applied from the shipped
# manifests, elect a leader on the real coordination.k8s.io Lease. Shown, in order:
# - exactly one replica acts; the other logs not_leader on every evaluation;
# - a running Slurm job on the node keeps it in Slurm while an inference pod is Unschedulable;
# - once the job ends and the node has been idle for slurm.idleTime, the leader drains it and
#   admits it (taint, cordon and label changed through the API); the pod schedules and runs on it;
# - a Slurm job that needs the node starts the return: the node is cordoned and tainted, the
#   pod's eviction is refused by the real Eviction API (429, a PodDisruptionBudget with
#   minAvailable 1), the pod keeps running and Slurm keeps the node drained;
# - the leader killed (SIGKILL) mid-return: the standby takes the Lease once its record has stood
#   for leaseDurationSeconds, reloads the journal and carries on the return;
# - the budget relaxed: the pod is evicted, the node resumed in Slurm and the job runs on it;
# - a static pod on the node (a node-local proxy, as some distributions run kube-proxy) is never
#   evicted and does not hold the return up: its mirror pod keeps its uid throughout.
# Figures printed: lend decision → pod Running, eviction → node back in Slurm, leader failover.
source "$(dirname "$0")/lib.sh"
# slurm_cluster.sh's helpers (conf_common, start_ctld, free_port, daemons_alive, show_logs, die,
# stop): they run with set +e, as in the script they come from.
source "$repo/tests/slurm/slurm_cluster.sh"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null; then
  [ "${CI:-}" = true ] && fail "slurmctld, slurmd or sbatch missing (make deps installs them; CI=true: failing)"
  echo "skipped: slurmctld, slurmd or sbatch missing (make deps installs them)"
  exit 77
fi
ns=gpulet-test-broker
work="$(mktemp -d /tmp/gpulet-broker-test.XXXXXX)"
sdir="$work/slurm"
mkdir "$sdir"
taint=gpulet.io/pool=slurm:NoSchedule
static="$GPULET_CLUSTER_BASE/static-pods/gpulet-test-node-proxy.yaml"  # the kubelet's staticPodPath
mirror=node-proxy-$node

cleanup() {
  local rc=$? f pid left
  set +e
  for f in "$work"/*.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    # Only a broker of this test: its command line names this directory.
    grep -q "$work/" "/proc/$pid/cmdline" 2>/dev/null && kill -TERM "$pid"
  done
  for f in "$work"/*.pid; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    grep -q "$work/" "/proc/$pid/cmdline" 2>/dev/null && kill -KILL "$pid"
  done
  (stop "$sdir") >/dev/null 2>&1
  rm -f "$static"
  kc delete namespace "$ns" --wait=false --ignore-not-found >/dev/null 2>&1
  [ -f "$work/rbac.yaml" ] && kc delete -f "$work/rbac.yaml" --ignore-not-found >/dev/null 2>&1
  kc delete lease -n gpulet-system gpulet-broker --ignore-not-found >/dev/null 2>&1
  kc uncordon "$node" >/dev/null 2>&1
  kc taint node "$node" gpulet.io/pool- >/dev/null 2>&1
  kc label node "$node" gpulet.io/pool- >/dev/null 2>&1
  rm -rf "$work"
  left="$(leftovers "$work")"
  if [ -n "$left" ]; then
    echo "FAIL: teardown left:$left" >&2
    exit 1
  fi
  exit "$rc"
}
trap cleanup EXIT
fail_evidence() {
  local f
  for f in "$work"/b1.log "$work"/b2.log; do
    [ -f "$f" ] && { echo "--- last lines of $f:"; tail -n 15 "$f"; }
  done
  [ -f "$sdir/slurm.conf" ] && { echo "--- squeue:"; squeue 2>&1; scontrol show node "$node" 2>&1 | grep -E 'State|Reason'; }
}

# slurm_up DIR: slurmctld and one slurmd named $node (the simulated DGX H100's 8 GPUs, described
# by `gpulet slurm gres`) on 127.0.0.1 ports picked here; pids in DIR/pids.
slurm_up() {
  local dir=$1 i pc pd line states=""
  : > "$dir/pids"
  mkdir -p "$dir/state" "$dir/spool-$node" "$dir/root/dev" "$dir/out"
  for i in 0 1 2 3 4 5 6 7; do mknod "$dir/root/dev/nvidia$i" c 195 "$i" || die "mknod failed"; done
  local gen=("$build/gpulet" --log-level warn --simulate dgx-h100 --sim-state "$dir/sim" slurm gres
    --node-name "$node" --dev-root "$dir/root")
  "${gen[@]}" --print gres -o "$dir/gres.conf" 2>/dev/null || die "gpulet slurm gres failed"
  line=$("${gen[@]}" --print slurm 2>/dev/null | grep '^NodeName=') || die "no NodeName line from gpulet slurm gres"
  pc=$(free_port); pd=$(free_port)
  cat > "$dir/slurm.conf" <<EOF
ClusterName=gbroker
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$pc
$(conf_common "$dir")
SlurmdParameters=config_overrides
$line NodeHostname=localhost NodeAddr=127.0.0.1 Port=$pd
PartitionName=gpu Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  start_ctld "$dir"
  slurmd -D -f "$SLURM_CONF" -N "$node" </dev/null >"$dir/slurmd.out" 2>&1 &
  echo $! >> "$dir/pids"
  for i in $(seq 1 300); do
    states=$(sinfo -h -N -o '%N=%T' 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$states" = "$node=idle " ] && return 0
    daemons_alive "$dir" || break
    sleep 0.2
  done
  show_logs "$dir/slurmd-$node.log" "$dir/slurmd.out" "$dir/slurmctld.log"
  die "slurmd $node did not become idle (states: $states)"
}

slurm_state() { sinfo -h -N -n "$node" -o %T; }                 # idle, mixed, drained, …
slurm_node_line() { scontrol show node "$node" | tr -s ' \n' ' '; }
job_state() { squeue -h -j "$1" -o %T; }
job_state_is() { [ "$(job_state "$1")" = "$2" ]; }
slurm_back() {  # the node schedulable in Slurm again (not drained)
  local l; l="$(slurm_node_line)"
  [[ "$l" =~ State=([A-Z+_]+) ]] && [[ "${BASH_REMATCH[1]}" != *DRAIN* ]]
}
submit() {  # submit SBATCH-ARGS...: prints the job id
  sbatch --parsable -o "$sdir/out/%j.out" --chdir "$sdir" "$@" --wrap 'exec sleep 600'
}

has_our_taint() { grep -q 'gpulet.io/pool' <<< "$(node_field '.spec.taints[*].key')"; }
cordoned() { [ "$(node_field '.spec.unschedulable')" = true ]; }
labelled() { [ "$(node_field '.metadata.labels.gpulet\.io/pool')" = inference ]; }
in_slurm_pool() { cordoned && has_our_taint && ! labelled; }
lent_to_k8s() { ! cordoned && ! has_our_taint && labelled; }
pod_gone() { ! kc get pod -n "$ns" "$1" >/dev/null 2>&1; }
pod_unschedulable() {
  [ "$(kc get pod -n "$ns" "$1" -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].reason}')" = Unschedulable ]
}

# Broker logs: decision lines after a mark (a line count), and when a line was written.
log_lines() { wc -l < "$work/$1.log"; }
after() { tail -n +$(($2 + 1)) "$work/$1.log" | grep -E -- "$3" || true; }  # after NAME MARK REGEX
count_after() { after "$@" | wc -l; }
has_after() { [ "$(count_after "$1" "$2" "$3")" -ge "${4:-1}" ]; }
stamp() { date -d "${1%% *}" +%s.%3N; }  # the epoch time of a log line
now() { date +%s.%3N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

say "the node agent serves 8 GPUs; the node starts in Slurm's pool (cordoned, tainted $taint)"
if ! allocatable_is 8; then
  kc label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
  kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
  until_true 180 "allocatable nvidia.com/gpu: 8" allocatable_is 8
fi
kc cordon "$node" >/dev/null
kc taint node "$node" "$taint" --overwrite >/dev/null
kc label node "$node" gpulet.io/pool- >/dev/null 2>&1 || true
fresh_namespace "$ns"
cat > "$static" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: node-proxy, namespace: kube-system}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - {name: main, image: localhost/gpulet/test:test, imagePullPolicy: Never, command: [sleep, "100000"]}
YAML
until_true 120 "the static pod's mirror $mirror Running" pod_phase_is kube-system "$mirror" Running
mirror_uid="$(kc get pod -n kube-system "$mirror" -o jsonpath='{.metadata.uid}')"

say "real Slurm: slurmctld and slurmd $node on loopback"
(set +eu; slurm_up "$sdir") || fail "Slurm did not come up"
export SLURM_CONF="$sdir/slurm.conf"
echo "$(sinfo -h -N -o '%N %T %G')"

say "deploy/broker's ServiceAccount and RBAC, applied as shipped; a token of that ServiceAccount"
kc kustomize "$repo/deploy/broker" 2>"$work/kustomize.err" | python3 -c '
import sys, yaml
keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
docs = [d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] in keep]
assert len(docs) == 5, [d["kind"] for d in docs]
yaml.safe_dump_all(docs, sys.stdout)' > "$work/rbac.yaml" || fail "kubectl kustomize deploy/broker"
kc apply -f "$work/rbac.yaml" >/dev/null || fail "the API server refused deploy/broker's RBAC"
kb="$work/broker.kubeconfig"
token="$(kc create token gpulet-broker -n gpulet-system --duration=2h)" || fail "token of gpulet-broker"
kubectl config --kubeconfig="$kb" set-cluster c --server="$GPULET_CLUSTER_API" \
  --certificate-authority="$GPULET_CLUSTER_BASE/pki/ca.crt" >/dev/null
kubectl config --kubeconfig="$kb" set-credentials gpulet-broker --token="$token" >/dev/null
kubectl config --kubeconfig="$kb" set-context c --cluster=c --user=gpulet-broker >/dev/null
kubectl config --kubeconfig="$kb" use-context c >/dev/null
chmod 600 "$kb"
as_broker() { kubectl --kubeconfig="$kb" --request-timeout=30s "$@"; }
[ "$(as_broker auth can-i create leases.coordination.k8s.io -n gpulet-system)" = yes ] \
  && [ "$(as_broker auth can-i create leases.coordination.k8s.io -n kube-system || true)" = no ] \
  || fail "the shipped RBAC should grant Leases in gpulet-system only"

# Short rules so the test runs in minutes. The Lease's namespace is the default, gpulet-system:
# the only one where the shipped Role grants Leases. A lease of 10 intervals, so that a leader
# slowed down by a loaded machine keeps it. returnAfterIdle is long: the return here is Slurm's
# demand.
cat > "$work/broker.yaml" <<YAML
slurm:
  nodes: [$node]
  minNodes: 0
  idleTime: 5s
kubernetes:
  namespaces: [$ns]
  maxNodes: 1
  kubeconfig: $kb
rules:
  demandEvaluations: 2
  minResidence: 0s
  cooldown: 0s
  returnAfterIdle: 1h
  evictionTimeout: 10m
  interval: 1s
journal: $work/journal.json
lease: {name: gpulet-broker, duration: 10s}
metrics: {address: "127.0.0.1:0"}
YAML
start_broker() {  # start_broker NAME: a replica in its own session, log NAME.log, pid NAME.pid
  setsid "$build/gpulet" broker run --config "$work/broker.yaml" > "$work/$1.log" 2>&1 < /dev/null &
  echo $! > "$work/$1.pid"
}
kc delete lease -n gpulet-system gpulet-broker --ignore-not-found >/dev/null  # an interrupted run's
start_broker b1
start_broker b2

say "two replicas, one Lease: exactly one acts"
holder() { kc get lease -n gpulet-system gpulet-broker -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
held_by_a_replica() { case "$(holder)" in *-"$(cat "$work/b1.pid")"|*-"$(cat "$work/b2.pid")") ;; *) false;; esac; }
until_true 60 "one of the replicas holding Lease gpulet-system/gpulet-broker" held_by_a_replica
until_true 60 "both replicas evaluating" eval 'has_after b1 0 event=broker_decision 3 && has_after b2 0 event=broker_decision 3'
case "$(holder)" in
  *-"$(cat "$work/b1.pid")") leader=b1 standby=b2;;
  *-"$(cat "$work/b2.pid")") leader=b2 standby=b1;;
  *) fail "the Lease's holder $(holder) is neither replica";;
esac
only_one_acts() {  # the standby's decisions are all not_leader, the leader's none (after MARKs)
  [ "$(count_after "$standby" "$1" event=broker_decision)" -gt 0 ] \
    && [ "$(after "$standby" "$1" 'event=broker_decision' | grep -vc reason_code=not_leader)" = 0 ] \
    && [ "$(count_after "$leader" "$2" reason_code=not_leader)" = 0 ]
}
only_one_acts 0 0 || fail "both or neither replica acted"
echo "leader $leader ($(holder)); $standby: $(count_after "$standby" 0 reason_code=not_leader) evaluations, all not_leader"

say "(c) a running Slurm job keeps the node in Slurm while an inference pod is Unschedulable"
job1="$(submit -w "$node" -N1 --gres=gpu:1)" || fail "sbatch refused the job"
until_true 60 "job $job1 RUNNING on $node" job_state_is "$job1" RUNNING
gpu_pod "$ns" infer-0 1
kc label pod -n "$ns" infer-0 app=infer >/dev/null
until_true 60 "infer-0 Unschedulable (node cordoned and tainted)" pod_unschedulable infer-0
mark="$(log_lines "$leader")"; smark="$(log_lines "$standby")"
busy='reason_code=no_candidate .*(a job holds resources|not plainly idle)'
until_true 60 "the leader refusing to lend a busy node 4 times" has_after "$leader" "$mark" "$busy" 4
only_one_acts "$smark" "$mark" || fail "the standby acted while job $job1 ran"
after "$leader" "$mark" "$busy" | tail -n 1 | sed 's/^.*reason=/refused: /'
job_state_is "$job1" RUNNING || fail "job $job1 no longer runs: $(job_state "$job1")"
case "$(slurm_state)" in mixed|allocated) ;; *) fail "Slurm shows $node $(slurm_state) while job $job1 runs";; esac
in_slurm_pool || fail "$node left Slurm's pool while job $job1 ran"
pod_phase_is "$ns" infer-0 Pending || fail "infer-0 is not Pending"

say "(a) the job ends: after slurm.idleTime the node is drained, admitted, and the pod runs on it"
mark="$(log_lines "$leader")"
scancel "$job1"
until_true 120 "the leader's lend (action=drain reason_code=k8s_demand)" has_after "$leader" "$mark" 'action=drain .*reason_code=k8s_demand'
lend_line="$(after "$leader" "$mark" 'action=drain .*reason_code=k8s_demand' | head -n 1)"
until_true 60 "$node drained in Slurm" eval '[ "$(slurm_state)" = drained ]'
until_true 60 "the admission (action=admit)" has_after "$leader" "$mark" 'action=admit .*reason_code=drained'
admit_line="$(after "$leader" "$mark" 'action=admit .*reason_code=drained' | head -n 1)"
until_true 60 "$node uncordoned, untainted, labelled gpulet.io/pool=inference in the API" lent_to_k8s
until_true 120 "infer-0 Running" pod_phase_is "$ns" infer-0 Running
t_running="$(now)"
[ "$(kc get pod -n "$ns" infer-0 -o jsonpath='{.spec.nodeName}')" = "$node" ] || fail "infer-0 runs elsewhere"
grep -q 'Reason=gpulet-broker: lent to kubernetes' <<< "$(slurm_node_line)" || fail "Slurm's drain reason is not the broker's: $(slurm_node_line)"
lend_s="$(elapsed "$(stamp "$lend_line")" "$t_running")"
echo "lend decision → pod Running: ${lend_s} s (drain → admit $(elapsed "$(stamp "$lend_line")" "$(stamp "$admit_line")") s)"
echo "node: unschedulable=$(node_field '.spec.unschedulable') taints=$(node_field '.spec.taints[*].key') pool=$(node_field '.metadata.labels.gpulet\.io/pool')"

say "(b) a PodDisruptionBudget protects the pod; a Slurm job needing the node starts the return"
kc apply -f - >/dev/null <<YAML
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: infer, namespace: $ns}
spec: {minAvailable: 1, selector: {matchLabels: {app: infer}}}
YAML
pdb_counted() {
  [ "$(kc get pdb -n "$ns" infer -o jsonpath='{.status.currentHealthy}/{.status.disruptionsAllowed}')" = "1/0" ]
}
until_true 60 "the budget counted by the disruption controller (1 healthy, 0 allowed)" pdb_counted
out="$(as_broker create --raw "/api/v1/namespaces/$ns/pods/infer-0/eviction" -f - 2>&1 <<JSON || true
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "infer-0", "namespace": "$ns"}}
JSON
)"
grep -q 'TooManyRequests' <<< "$out" || fail "the broker's token evicting infer-0 was not refused with 429: $out"
echo "the Eviction API with the broker's token: ${out#Error from server }"
mark="$(log_lines "$leader")"
job2="$(submit -N1 --gres=gpu:8)" || fail "sbatch refused the job"
until_true 60 "the leader's return (action=start-return reason_code=slurm_demand)" \
  has_after "$leader" "$mark" 'action=start-return .*reason_code=slurm_demand'
until_true 60 "$node cordoned, tainted, unlabelled in the API" in_slurm_pool
until_true 60 "3 evictions refused by the budget" has_after "$leader" "$mark" 'event=broker_evict .*evicted=0 blocked_by_pdb=1' 3
pod_phase_is "$ns" infer-0 Running || fail "the protected pod was disrupted"
job_state_is "$job2" PENDING || fail "job $job2 is $(job_state "$job2") while the node is still Kubernetes'"
[ "$(slurm_state)" = drained ] || fail "Slurm shows $node $(slurm_state) while the pod is protected"
echo "infer-0 Running, $node drained in Slurm, job $job2 PENDING ($(squeue -h -j "$job2" -o %r))"

say "the leader killed mid-return: the standby takes the Lease and carries the return on"
transitions() { kc get lease -n gpulet-system gpulet-broker -o jsonpath='{.spec.leaseTransitions}'; }
before="$(transitions)"
only_one_acts 0 0 || fail "both replicas acted before the leader was killed"
smark="$(log_lines "$standby")"
t_kill="$(now)"
kill -KILL "$(cat "$work/$leader.pid")"
{ wait "$(cat "$work/$leader.pid")"; } 2>/dev/null || true  # (no "Killed" report)
until_true 60 "$standby acquiring the Lease" has_after "$standby" "$smark" 'event=broker_lease_acquired'
until_true 30 "$standby evicting (blocked)" has_after "$standby" "$smark" 'event=broker_evict .*blocked_by_pdb=1'
acq_line="$(after "$standby" "$smark" 'event=broker_lease_acquired' | head -n 1)"
act_line="$(after "$standby" "$smark" 'action=evict ' | head -n 1)"
has_after "$standby" "$smark" 'event=broker_journal_reloaded .*in_transit=1' || fail "$standby did not reload the journal"
case "$(holder)" in *-"$(cat "$work/$standby.pid")") ;; *) fail "the Lease's holder is $(holder)";; esac
[ "$(transitions)" -gt "${before:-0}" ] || fail "leaseTransitions did not move ($before → $(transitions))"
failover_s="$(elapsed "$t_kill" "$(stamp "$acq_line")")"
echo "failover: leader killed → $standby holds the Lease ${failover_s} s, → first action $(elapsed "$t_kill" "$(stamp "$act_line")") s (leaseDurationSeconds 10); leaseTransitions $before → $(transitions)"
leader=$standby

say "the budget relaxed: the pod is evicted, the node resumed in Slurm, the job runs on it"
mark="$(log_lines "$leader")"
kc patch pdb -n "$ns" infer --type merge -p '{"spec":{"minAvailable":0}}' >/dev/null
until_true 60 "the eviction accepted" has_after "$leader" "$mark" 'event=broker_evict .*evicted=1 blocked_by_pdb=0'
evict_line="$(after "$leader" "$mark" 'event=broker_evict .*evicted=1' | head -n 1)"
until_true 60 "infer-0 gone" pod_gone infer-0
until_true 60 "$node back in Slurm (no DRAIN)" slurm_back
t_back="$(now)"
has_after "$leader" "$mark" 'action=resume .*reason_code=returned' || fail "the node left DRAIN without the broker's resume"
until_true 60 "job $job2 RUNNING" job_state_is "$job2" RUNNING
[ "$(squeue -h -j "$job2" -o %N)" = "$node" ] || fail "job $job2 runs on $(squeue -h -j "$job2" -o %N)"
in_slurm_pool || fail "$node is not cordoned and tainted after its return"
[ "$(kc get pod -n kube-system "$mirror" -o jsonpath='{.metadata.uid}/{.status.phase}')" = "$mirror_uid/Running" ] \
  || fail "the static pod's mirror was evicted (uid $mirror_uid before)"
! grep -qE 'reason="evicting ([02-9]|[1-9][0-9]+) pods' "$work/b1.log" "$work/b2.log" \
  || fail "a broker evicted more than the one inference pod: $(grep -hoE 'evicting [0-9]+ pods' "$work"/b?.log | sort -u)"
take_s="$(elapsed "$(stamp "$evict_line")" "$t_back")"
echo "eviction → node back in Slurm: ${take_s} s; $(slurm_node_line | grep -o 'State=[^ ]*'), job $job2 RUNNING"

say "what the replicas did (every action but none; conflicts, warnings, errors)"
for b in b1 b2; do  # a run of equal decisions is shown once, with its count
  grep -v 'action=none' "$work/$b.log" | grep -E 'action=|conflict|level=(warning|error)|lease_acquired|journal_reloaded' \
    | awk -v b="$b" '{ k = $0; sub(/^[^ ]+ /, "", k) } k == prev { n++; next }
        { if (n) print b "   … " n " more"; print b " " $0; prev = k; n = 0 } END { if (n) print b "   … " n " more" }' || true
done
say "figures: lend decision → pod Running ${lend_s} s; eviction → node back in Slurm ${take_s} s; leader failover ${failover_s} s"
echo PASS
