# Shared by the fleet tier (sourced): the control-plane-only cluster instance 1
# (GPULET_CLUSTER_INSTANCE=1 testing/cluster/cluster.sh), fleets of Node objects without kubelets
# (testing/cluster/k8s/fleet) and gpulet's extender as a host process on 127.0.0.1 with mutual TLS,
# called by instance 1's real kube-scheduler. The cluster_fleet_up fixture (run_fixture.sh) starts
# them; the tests use them. A failed check prints the evidence and exits 1.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The tests use instance 1; bench/fleet uses instance 2 (GPULET_FLEET_INSTANCE=2), so the two never meet.
export GPULET_CLUSTER_INSTANCE="${GPULET_FLEET_INSTANCE:-1}"
state="${GPULET_FLEET_STATE:-/run/gpulet-fleet-$GPULET_CLUSTER_INSTANCE}"   # certificates, pids, logs, the fleet binary
ext_port="${GPULET_FLEET_EXTENDER_PORT:-$((18443 + 10 * GPULET_CLUSTER_INSTANCE))}"
ext_name=gpulet-extender.gpulet-system.svc                 # the name in make-certs.sh's server certificate

cluster_env() { eval "$("$repo/testing/cluster/cluster.sh" env)"; }

source "$repo/tests/cluster/common.sh"
fail_evidence() { echo "--- extender log:"; tail -20 "$state/logs/extender.log"; }

# ext_curl PATH [CURL ARGS...]: the extender as kube-scheduler reaches it (its client certificate,
# the server CA, the certificate's name on 127.0.0.1).
ext_curl() {
  local path="$1"; shift
  curl -sS --max-time 10 --cacert "$state/certs/scheduler/ca.crt" --cert "$state/certs/scheduler/tls.crt" \
    --key "$state/certs/scheduler/tls.key" --resolve "$ext_name:$ext_port:127.0.0.1" \
    "https://$ext_name:$ext_port$path" "$@"
}

# ext_metric NAME{LABELS}: the value of one series on the extender's /metrics (0 when absent).
ext_metric() {
  ext_curl /metrics | awk -v s="$1" '$1 == s {v = $2} END {print v + 0}'
}

# memory_pod NAME UNITS [PRIORITYCLASS]: a pod of the gpulet-memory profile asking UNITS GiB on
# one GPU of the "ext" fleet.
memory_pod() {
  local pc=""
  [ -n "${3:-}" ] && pc="priorityClassName: $3"
  kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: fleet-ext}
spec:
  schedulerName: gpulet-memory
  terminationGracePeriodSeconds: 0
  nodeSelector: {gpulet.io/fleet: ext}
  $pc
  containers:
    - name: main
      image: localhost/gpulet/test:test
      resources:
        limits: {gpulet.io/gpu-memory-1gi: $2}
YAML
}

pod_node() { kc get pod -n "$1" "$2" -o jsonpath='{.spec.nodeName}'; }
pod_bound() { [ -n "$(pod_node "$1" "$2")" ]; }

# scheduler_said NAMESPACE POD TEXT: a FailedScheduling event for POD contains TEXT.
scheduler_said() {  # (the output read whole first: grep -q ending early would SIGPIPE kubectl)
  local m
  m="$(kc get events -n "$1" --field-selector "involvedObject.name=$2,reason=FailedScheduling" \
    -o jsonpath='{.items[*].message}')"
  [[ "$m" == *"$3"* ]]
}

fresh_namespace() {  # fresh_namespace NAME: an empty namespace (pods of kubelet-less nodes force-deleted)
  kc delete pods -n "$1" --all --grace-period=0 --force >/dev/null 2>&1 || true
  kc delete namespace "$1" --ignore-not-found --wait=true --timeout=120s >/dev/null
  kc create namespace "$1" >/dev/null
  until_true 60 "default ServiceAccount in $1" kc get serviceaccount -n "$1" default
}

# ---------------------------------------------------------------------------------------------
# Bring-up and teardown, shared by the fixture (run_fixture.sh) and bench/fleet/run.sh.

fleet_die() {
  echo "fleet: FAILED: $*" >&2
  for f in "$state"/logs/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }; done
  exit 1
}

start_bg() {  # start_bg NAME COMMAND...: in its own session, pid and log recorded under $state
  local name="$1"; shift
  setsid "$@" >> "$state/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$state/pids/$name"
}

stop_bg() {  # stop_bg [NAME...]: what start_bg started (all without NAME), if the pid is still ours
  local f pid exe n names=("$@")
  [ ${#names[@]} -gt 0 ] || names=($(ls "$state/pids" 2>/dev/null))
  for n in "${names[@]}"; do
    f="$state/pids/$n"
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
    case "$exe" in
      "$state/fleet"|"$state/fleet (deleted)"|*/gpulet|*"/gpulet (deleted)")   # (deleted): rebuilt since
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true;;
    esac
    rm -f "$f"
  done
}

# wait_file SECONDS FILE PIDNAME: until FILE exists (fleet -ready-file), failing if PIDNAME exits.
wait_file() {
  local end=$((SECONDS + $1))
  until [ -f "$2" ]; do
    [ $SECONDS -lt $end ] || fleet_die "$2 not written after $1 s"
    kill -0 "$(cat "$state/pids/$3")" 2>/dev/null || fleet_die "$3 exited"
    sleep 0.5
  done
}

# scheduler_config WITH_EXTENDER OUT [RESOURCE]: top-level KubeSchedulerConfiguration keys appended to
# cluster.sh's own (which sets clientConnection and leaderElection). With the extender:
# deploy/extender/kube-scheduler-config.yaml adapted in URL and paths only (the extender on
# 127.0.0.1:$ext_port, the certificates under $state; tlsConfig.serverName names the server
# certificate's DNS name, since the URL is an address), plus a default-scheduler profile for pods
# that do not opt in. Without: the same two profiles and the scheduler's defaults. RESOURCE: one
# more managedResources entry (another unit size, as the shipped file's comment says to add).
scheduler_config() {
  if [ "$1" = 0 ]; then
    printf 'profiles:\n  - schedulerName: default-scheduler\n  - schedulerName: gpulet-memory\n' > "$2"
    return
  fi
  python3 - "$repo/deploy/extender/kube-scheduler-config.yaml" "$2" "$ext_port" "$state/certs/scheduler" "$ext_name" "${3:-}" <<'PY'
import re, sys
src, out, port, certs, name, extra = sys.argv[1:]
text = open(src).read()
text = re.sub(r"(?m)^(apiVersion|kind):.*\n", "", text)
text = re.sub(r"(?m)^leaderElection:\n(  .*\n)+", "", text)
text = text.replace("urlPrefix: https://gpulet-extender.gpulet-system.svc:8443",
                    "urlPrefix: https://127.0.0.1:" + port)
text = text.replace("/etc/gpulet-extender-client/", certs + "/")
text = re.sub(r"(?m)^(\s+)caFile: (.*)$", r"\1caFile: \2\n\1serverName: " + name, text)
text = text.replace("profiles:\n", "profiles:\n  - schedulerName: default-scheduler\n", 1)
if extra:
    entry = "      - name: gpulet.io/gpu-memory-1gi\n        ignoredByScheduler: false\n"
    assert entry in text
    text = text.replace(entry, entry + entry.replace("gpulet.io/gpu-memory-1gi", extra))
assert "127.0.0.1:" + port in text and "serverName" in text and "leaderElection" not in text
open(out, "w").write(text)
PY
}

# fleet_cluster_up BUILD: the fleet tool built, the extender's certificates issued
# (deploy/extender/make-certs.sh), the cluster instance up with the extender in its scheduler's
# configuration, the extender's ServiceAccount and RBAC applied (deploy/extender) and `gpulet
# extender` started as a host process with a token of that ServiceAccount, the shipped web config
# (paths adapted) and the shipped flags (--policy=bestfit).
fleet_cluster_up() {
  local build="$1" cache="${GPULET_CLUSTER_CACHE:-/var/cache/gpulet-cluster}"
  command -v go >/dev/null || PATH="/usr/local/go/bin:$PATH"
  [ -x "$build/gpulet" ] || fleet_die "$build/gpulet is not built"
  fleet_cluster_down 2>/dev/null || true
  mkdir -p "$state/pids" "$state/logs"
  # The fleet client, from the module that builds the upstream components (its go.sum, its cache).
  (cd "$repo/testing/cluster/k8s" && GOTOOLCHAIN=local GOFLAGS="-trimpath -mod=mod" CGO_ENABLED=0 \
    GOMODCACHE="$cache/mod" GOCACHE="$cache/gocache" go build -o "$state/fleet" ./fleet) \
    || fleet_die "go build ./fleet"
  "$repo/deploy/extender/make-certs.sh" "$state/certs" gpulet-system > /dev/null || fleet_die "make-certs.sh"
  sed "s|/etc/gpulet-extender/tls/|$state/certs/extender/|" "$repo/deploy/extender/web-config.yaml" \
    > "$state/web-config.yaml"
  scheduler_config 1 "$state/scheduler-extender.yaml" || fleet_die "scheduler configuration"
  scheduler_config 0 "$state/scheduler-plain.yaml"
  GPULET_CLUSTER_SCHEDULER_EXTRA="$state/scheduler-extender.yaml" "$repo/testing/cluster/cluster.sh" up --no-node \
    || fleet_die "cluster instance $GPULET_CLUSTER_INSTANCE did not come up"
  cluster_env
  kc create namespace gpulet-system >/dev/null 2>&1 || true
  kc apply -n gpulet-system -f "$repo/deploy/extender/serviceaccount.yaml" -f "$repo/deploy/extender/rbac.yaml" >/dev/null \
    || fleet_die "deploy/extender's ServiceAccount and RBAC"
  local token
  token="$(kc create token gpulet-extender -n gpulet-system --duration=4h)" || fleet_die "token of gpulet-extender"
  cat > "$state/extender.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "$GPULET_CLUSTER_API", certificate-authority: "$GPULET_CLUSTER_BASE/pki/ca.crt"}
users:
- name: gpulet-extender
  user: {token: "$token"}
contexts:
- name: c
  context: {cluster: c, user: gpulet-extender}
current-context: c
KC
  chmod 600 "$state/extender.kubeconfig"
  start_extender "$build" --policy=bestfit
}

# start_extender BUILD FLAGS...: `gpulet extender` (stopped first if running) with the shipped
# listener, web config and token, and FLAGS (the shipped Deployment's: --policy=bestfit).
start_extender() {
  local build="$1"; shift
  stop_bg extender
  start_bg extender "$build/gpulet" extender --listen "127.0.0.1:$ext_port" --web-config-file "$state/web-config.yaml" \
    --kubeconfig "$state/extender.kubeconfig" --namespace gpulet-system "$@"
  local end=$((SECONDS + 60))
  until ext_curl /healthz >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fleet_die "the extender did not answer /healthz with the scheduler's certificate in 60 s"
    sleep 0.5
  done
}

# use_scheduler WITH_EXTENDER|FILE: restart the instance's kube-scheduler with or without the
# extender, or with the configuration in FILE.
use_scheduler() {
  local f="$state/scheduler-plain.yaml"
  [ "$1" = 1 ] && f="$state/scheduler-extender.yaml"
  [ -f "$1" ] && f="$1"
  GPULET_CLUSTER_SCHEDULER_EXTRA="$f" "$repo/testing/cluster/cluster.sh" restart kube-scheduler >/dev/null
}

fleet_cluster_down() {
  [ -d "$state/pids" ] && stop_bg
  "$repo/testing/cluster/cluster.sh" down || return 1
  rm -rf "$state"
}
