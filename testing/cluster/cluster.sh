#!/usr/bin/env bash
# A real single-node Kubernetes on this machine, from upstream's own components (built by build.sh):
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, CoreDNS (the cluster's DNS),
# containerd (+ runc), the CNI bridge and a kubelet, each a host process. See docs/real-cluster.md.
#
#   cluster.sh up [--no-node]   bring it up layer by layer (control plane, runtime, node Ready),
#                               naming the layer that failed; --no-node stops after the control plane
#   cluster.sh down             tear it down: no process, mount, cgroup, network device or file is left
#                               outside the build cache (also cleans what an interrupted run left)
#   cluster.sh status           what runs, and the kubeconfig to use
#   cluster.sh env              shell lines: KUBECONFIG, PATH and the cluster's variables
#   cluster.sh images BUILD     (re)build and import the pause, test and gpulet images
#   cluster.sh restart kubelet  stop the kubelet (or kube-scheduler) and start it again (pods keep running)
#
# Addresses: etcd, the controller-manager, the scheduler and the kubelet's health port listen on
# 127.0.0.1; the API server, the kubelet and CoreDNS (port 53) on the bridge's gateway (10.88.0.1 on
# cni0, a bridge this script makes), which pods reach too. Nothing listens on, or is sent to,
# another address: CoreDNS answers cluster.local and refuses every other name (no forwarding).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${GPULET_CLUSTER_CACHE:-$([ "$(id -u)" = 0 ] && echo /var/cache/gpulet-cluster || echo "${XDG_CACHE_HOME:-$HOME/.cache}/gpulet-cluster")}"
# GPULET_CLUSTER_INSTANCE=N (1-9): a second, control-plane-only cluster beside the default one,
# with its own directories and ports (N*10 above the default ones) and its API server on 127.0.0.1;
# for work that needs no kubelet (scheduling at scale, RBAC, admission) while the node cluster runs.
instance="${GPULET_CLUSTER_INSTANCE:-0}"
case "$instance" in [0-9]) ;; *) echo "cluster: GPULET_CLUSTER_INSTANCE must be 0-9" >&2; exit 2;; esac
suffix=""; [ "$instance" = 0 ] || suffix="-$instance"
off=$((instance * 10))
base="${GPULET_CLUSTER_BASE:-/var/lib/gpulet-k8s$suffix}"     # configs, PKI, etcd, containerd root, logs
run="${GPULET_CLUSTER_RUN:-/run/gpulet-k8s$suffix}"           # sockets, pids, netns, containerd state
etcd_port=$((2379 + off)); etcd_peer=$((2380 + off)); etcd_metrics=$((2381 + off))
api_port=$((6443 + off)); kcm_port=$((10257 + off)); sched_port=$((10259 + off))
kubelet_root=/var/lib/kubelet                          # where the shipped manifests' hostPaths point
node="${GPULET_CLUSTER_NODE:-gpulet-node-0}"
bridge=cni0
gw=10.88.0.1
pod_cidr=10.88.0.0/16
svc_cidr=10.0.0.0/24
api_host="$gw"; [ "$instance" = 0 ] || api_host=127.0.0.1
api="https://$api_host:$api_port"
marker_name=.gpulet-k8s-owned                         # marks a directory this script made

log() { echo "cluster: $*" >&2; }
die() { echo "cluster: FAILED: $*" >&2; exit 1; }

bin_dir() { "$here/build.sh"; }

# ---------------------------------------------------------------------------------------------
# Teardown: safe to run at any time, on any leftover of an earlier run.

owned_pids() {  # this instance's processes: a cluster binary (cache bin dirs) naming its directories
  local p exe
  for p in /proc/[0-9]*; do
    exe="$(readlink "$p/exe" 2>/dev/null || true)"
    case "$exe" in
      "$cache"/bin/*) tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qE "($base|$run)/" && echo "${p#/proc/}";;
    esac
  done
}

kill_pidfile() {  # kill_pidfile NAME: the process started for NAME, if it still is ours
  local f="$run/pids/$1" pid exe
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null || true)"
  if [[ "$exe" == "$cache"/bin/* ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

kubepods_cgroups() {  # every kubepods cgroup directory in every v1 hierarchy, deepest first
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d
    [ -d "$h/kubepods.slice" ] && find "$h/kubepods.slice" -depth -type d
  done 2>/dev/null || true
}

down() {
  local pids p m
  if [ -S "$run/containerd/containerd.sock" ] && [ -n "$(owned_pids)" ]; then
    # Stop the pods' containers through the runtime first, so their shims unmount what they mounted.
    local ctr_bin
    ctr_bin="$(ls -d "$cache"/bin/*/ctr 2>/dev/null | head -1 || true)"
    if [ -n "$ctr_bin" ]; then
      for c in $(timeout 10 "$ctr_bin" --address "$run/containerd/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
        timeout 10 "$ctr_bin" --address "$run/containerd/containerd.sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true
      done
    fi
  fi
  for p in kubelet kube-scheduler kube-controller-manager coredns kube-apiserver; do kill_pidfile "$p"; done
  # Whatever still runs in the pods' cgroups (made by this cluster's kubelet) is a container process.
  [ "$instance" = 0 ] && for m in $(kubepods_cgroups); do
    [ -f "$m/cgroup.procs" ] && for p in $(cat "$m/cgroup.procs" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
  done
  kill_pidfile containerd
  for p in $(owned_pids); do kill -KILL "$p" 2>/dev/null || true; done   # shims, etcd, stragglers
  kill_pidfile etcd
  for _ in $(seq 50); do [ -z "$(owned_pids)" ] && break; sleep 0.1; done
  # Mounts under the cluster's directories and the kubelet's, deepest first.
  local roots="$run|$base"
  [ "$instance" = 0 ] && roots="$roots|$kubelet_root"
  for _ in 1 2 3; do
    mapfile -t mounts < <(awk '{print $5}' /proc/self/mountinfo | grep -E "^($roots)(/|$)" | sort -r || true)
    [ "${#mounts[@]}" = 0 ] && break
    for m in "${mounts[@]}"; do umount -l "$m" 2>/dev/null || true; done
  done
  if [ "$instance" != 0 ]; then
    rm -rf "$base" "$run"
    [ -z "$(owned_pids)" ] || die "teardown: processes left: $(owned_pids | tr '\n' ' ')"
    log "down: nothing of cluster instance $instance is left"
    return 0
  fi
  for _ in $(seq 30); do
    local left=0
    for m in $(kubepods_cgroups); do rmdir "$m" 2>/dev/null || left=1; done
    [ "$left" = 0 ] && break
    sleep 0.2
  done
  [ -z "$(kubepods_cgroups)" ] || log "warning: cgroups left: $(kubepods_cgroups | tr '\n' ' ')"
  ip link del "$bridge" 2>/dev/null || true
  # A pod's veth host end goes with its network namespace, which goes with its last process and
  # mount (both removed above).
  # Files the cluster made outside its own directories: CDI specs gpulet wrote, the kubelet's logs,
  # directories the manifests' hostPaths created (only when this script recorded making them).
  if [ -f "$run/made-paths" ]; then
    while read -r m; do [ -n "$m" ] && rm -rf -- "$m"; done < <(sort -r "$run/made-paths")
  fi
  for m in /etc/cdi /var/run/cdi; do rm -f "$m"/*gpulet* 2>/dev/null || true; done
  [ -f "$kubelet_root/$marker_name" ] && rm -rf "$kubelet_root"
  rm -rf "$base" "$run"
  [ -z "$(owned_pids)" ] || die "teardown: processes left: $(owned_pids | tr '\n' ' ')"
  log "down: nothing of the cluster is left"
}

# ---------------------------------------------------------------------------------------------
# Bring-up

# make_path DIR: mkdir -p, recording each directory this run created (removed again by down).
make_path() {
  local d="$1" missing=()
  while [ ! -e "$d" ]; do missing+=("$d"); d="$(dirname "$d")"; done
  mkdir -p "$1"
  for d in "${missing[@]}"; do echo "$d" >> "$run/made-paths"; done
}

preflight() {
  [ "$(id -u)" = 0 ] || die "preflight: the cluster needs root (containerd, the kubelet, cgroups, mounts)"
  local avail
  avail="$(df -Pk /var/lib | awk 'NR==2{print int($4/1024/1024)}')"
  [ "$avail" -ge 5 ] || die "preflight: $avail GiB free under /var/lib; the cluster needs 5 GiB"
  [ -e /dev/kmsg ] || die "preflight: /dev/kmsg is missing (the kubelet's OOM watcher needs it)"
  for c in cpu cpuacct cpuset memory; do
    grep -qw "$c" /proc/self/mountinfo || die "preflight: cgroup controller $c is not mounted"
  done
  for t in runc openssl python3 gcc ip; do command -v "$t" >/dev/null || die "preflight: $t not found (make deps installs it)"; done
  [ -x /usr/lib/cni/bridge ] || die "preflight: /usr/lib/cni/bridge missing (Debian package containernetworking-plugins)"
  [ -x /bin/busybox ] || die "preflight: /bin/busybox missing (Debian package busybox-static)"
  [ "$instance" = 0 ] || return 0
  if [ -d "$kubelet_root" ] && [ ! -f "$kubelet_root/$marker_name" ]; then
    die "preflight: $kubelet_root exists and was not made by this script: another kubelet owns this machine"
  fi
  if ip link show "$bridge" >/dev/null 2>&1 && [ ! -d "$run" ]; then
    die "preflight: a $bridge bridge exists that this script did not make"
  fi
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local t="$1" what="$2"; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.3
  done
}

start() {  # start NAME COMMAND...: a daemon in its own session, its pid and log recorded
  local name="$1"; shift
  setsid "$@" >> "$base/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/pids/$name"
}

layer_failed() {  # layer_failed LAYER LOG...: name the layer and show the end of its logs
  local layer="$1"; shift
  echo "cluster: FAILED at layer: $layer" >&2
  for f in "$@"; do
    [ -f "$base/logs/$f.log" ] && { echo "--- last lines of $f.log ---" >&2; tail -25 "$base/logs/$f.log" >&2; }
  done
  exit 1
}

pki() {
  local d="$base/pki"
  mkdir -p "$d"
  cd "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=gpulet-test-ca -keyout ca.key -out ca.crt 2>/dev/null
  leaf() {  # leaf NAME SUBJECT USAGE [SAN]
    local ext="extendedKeyUsage=$3"
    [ -n "${4:-}" ] && ext="$ext"$'\n'"subjectAltName=$4"
    openssl req -new -newkey rsa:2048 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
      -extfile <(printf '%s\n' "$ext") -out "$1.crt" 2>/dev/null
    rm -f "$1.csr"
  }
  leaf apiserver /CN=kube-apiserver serverAuth \
    "IP:$gw,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  leaf admin "/O=system:masters/CN=admin" clientAuth
  leaf kubelet "/O=system:nodes/CN=system:node:$node" clientAuth
  leaf kubelet-serving "/CN=$node" serverAuth "IP:$gw,IP:127.0.0.1,DNS:$node"
  leaf controller-manager /CN=system:kube-controller-manager clientAuth
  leaf scheduler /CN=system:kube-scheduler clientAuth
  leaf coredns /CN=system:coredns clientAuth
  leaf apiserver-kubelet-client /CN=kube-apiserver-kubelet-client clientAuth
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  chmod 600 ./*.key
  cd - >/dev/null
}

kubeconfig() {  # kubeconfig NAME: a kubeconfig for the client certificate NAME
  local d="$base/pki"
  cat > "$base/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpulet-test
  cluster:
    server: $api
    certificate-authority: $d/ca.crt
users:
- name: $1
  user:
    client-certificate: $d/$1.crt
    client-key: $d/$1.key
contexts:
- name: gpulet-test
  context: {cluster: gpulet-test, user: $1}
current-context: gpulet-test
EOF
}

control_plane() {
  local bin="$1"
  log "layer 1/3: control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler$([ "$instance" != 0 ] || echo ", CoreDNS"))"
  start etcd "$bin/etcd" --name default --data-dir "$base/etcd" \
    --listen-client-urls http://127.0.0.1:$etcd_port --advertise-client-urls http://127.0.0.1:$etcd_port \
    --listen-peer-urls http://127.0.0.1:$etcd_peer --initial-advertise-peer-urls http://127.0.0.1:$etcd_peer \
    --initial-cluster default=http://127.0.0.1:$etcd_peer --listen-metrics-urls http://127.0.0.1:$etcd_metrics \
    --unsafe-no-fsync --log-level warn
  wait_for 30 etcd curl -sf http://127.0.0.1:$etcd_port/health || layer_failed "control plane: etcd" etcd
  local p="$base/pki" reconciler=()
  # An instance on 127.0.0.1 advertises a loopback address, which the API server's endpoint
  # reconciler refuses ("may not be in the loopback range"); it has no in-cluster clients, so the
  # kubernetes Service's endpoints are not reconciled.
  [ "$instance" = 0 ] || reconciler=(--endpoint-reconciler-type=none)
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers=http://127.0.0.1:$etcd_port "${reconciler[@]}" \
    --bind-address="$api_host" --advertise-address="$api_host" --secure-port=$api_port \
    --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$p/sa.pub" \
    --service-account-signing-key-file="$p/sa.key" --service-cluster-ip-range="$svc_cidr" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$p/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --profiling=false --v=1
  wait_for 90 apiserver "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" get --raw /readyz \
    || layer_failed "control plane: kube-apiserver" kube-apiserver etcd
  # The API server calls the kubelet as kube-apiserver-kubelet-client (logs, exec).
  "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" create clusterrolebinding gpulet-test-apiserver-kubelet \
    --clusterrole=system:kubelet-api-admin --user=kube-apiserver-kubelet-client >/dev/null
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$base/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$base/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$base/controller-manager.kubeconfig" \
    --use-service-account-credentials --service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
    --cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
    --controllers='*' --leader-elect=false --bind-address=127.0.0.1 --secure-port=$kcm_port --profiling=false --v=1
  # GPULET_CLUSTER_SCHEDULER_QPS: the scheduler's API client QPS, burst twice that (upstream: 50).
  cat > "$base/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $base/scheduler.kubeconfig
  qps: ${GPULET_CLUSTER_SCHEDULER_QPS:-50}
  burst: $((2 * ${GPULET_CLUSTER_SCHEDULER_QPS:-50}))
leaderElection:
  leaderElect: false
EOF
  # GPULET_CLUSTER_SCHEDULER_EXTRA: a file of top-level KubeSchedulerConfiguration keys (for example
  # gpulet's `extenders:` entry, as deploy/extender ships it) appended to the scheduler's config.
  if [ -n "${GPULET_CLUSTER_SCHEDULER_EXTRA:-}" ]; then { echo "# extra"; cat "$GPULET_CLUSTER_SCHEDULER_EXTRA"; } >> "$base/scheduler.yaml"; fi
  start_scheduler "$bin"
  wait_for 60 kcm curl -skf https://127.0.0.1:$kcm_port/healthz || layer_failed "control plane: kube-controller-manager" kube-controller-manager
  wait_for 60 scheduler curl -skf https://127.0.0.1:$sched_port/healthz || layer_failed "control plane: kube-scheduler" kube-scheduler
  wait_for 60 default-sa "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" get serviceaccount default \
    || layer_failed "control plane: service accounts (kube-controller-manager)" kube-controller-manager
  [ "$instance" != 0 ] || cluster_dns "$bin"
  log "layer 1/3: control plane ready"
}

# The cluster's DNS: upstream's CoreDNS (build.sh builds it with only the plugins used here) on the
# bridge's gateway, serving cluster.local from the API server (Services, headless Services' pod
# records) as the identity system:coredns with CoreDNS's own read-only grants. There is no forward
# plugin: a name outside cluster.local is REFUSED, so no query leaves the machine. The kubelet gives
# pods this server (clusterDNS). Checked by a query for the API server's Service and one for an
# outside name.
cluster_dns() {
  local bin="$1"
  "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "gpulet-test:coredns"}
rules:
  - {apiGroups: [""], resources: [endpoints, services, pods, namespaces], verbs: [list, watch]}
  - {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "gpulet-test:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "gpulet-test:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:coredns"}]
EOF
  cat > "$base/Corefile" <<EOF
cluster.local:53 {
  bind $gw
  errors
  log
  kubernetes cluster.local {
    kubeconfig $base/coredns.kubeconfig gpulet-test
  }
}
EOF
  start coredns "$bin/coredns" -conf "$base/Corefile"
  wait_for 30 dns "$here/dns_query.py" "$gw" kubernetes.default.svc.cluster.local 10.0.0.1 \
    || layer_failed "control plane: cluster DNS (CoreDNS on $gw:53 answering kubernetes.default.svc.cluster.local)" coredns
  "$here/dns_query.py" "$gw" gpulet.invalid.example.com REFUSED >/dev/null \
    || layer_failed "control plane: cluster DNS answered a name outside cluster.local (it must refuse it)" coredns
}

runtime() {
  local bin="$1" build="$2"
  log "layer 2/3: runtime (containerd $(basename "$bin"), runc, CNI bridge, images)"
  mkdir -p "$base/cni/net.d" "$run/cni"
  cat > "$base/cni/net.d/10-gpulet.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "gpulet-test", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$run/cni/ipam", "ranges": [[{"subnet": "$pod_cidr", "gateway": "$gw"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "loopback"}]}
EOF
  cat > "$base/containerd.toml" <<EOF
version = 3
root = "$base/containerd"
state = "$run/containerd"
[grpc]
  address = "$run/containerd/containerd.sock"
[ttrpc]
  address = "$run/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/gpulet/pause:test"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine withholds CAP_SYS_RESOURCE from every process, so no oom_score_adj can go below
  # the current one: the sandbox's -998 failed in runc ("failed to update /proc/self/oom_score_adj:
  # Permission denied"). Clamp to containerd's own value instead, as for rootless containerd.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "$(command -v runc)"
      Root = "$run/runc"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$base/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
  # containerd 2 puts its shims' sockets in /run/containerd/s whatever its state directory: made
  # here when missing, so that teardown removes it.
  make_path /run/containerd/s
  PATH="$bin:$PATH" start containerd "$bin/containerd" --config "$base/containerd.toml"
  wait_for 30 containerd "$bin/ctr" --address "$run/containerd/containerd.sock" version \
    || layer_failed "runtime: containerd" containerd
  images "$build" || layer_failed "runtime: image import" containerd
  # Rung: a container through containerd and runc alone, before any kubelet.
  if ! timeout 60 "$bin/ctr" --address "$run/containerd/containerd.sock" -n k8s.io run --rm \
      localhost/gpulet/test:test gpulet-smoke /bin/sh -c 'echo runtime-ok' > "$base/logs/smoke.log" 2>&1 \
      || ! grep -q runtime-ok "$base/logs/smoke.log"; then
    layer_failed "runtime: a container through containerd + runc" smoke containerd
  fi
  log "layer 2/3: runtime ready (a container ran through containerd and runc)"
}

images() {  # images BUILD: pause, test and gpulet images, built here and imported into containerd
  local build="$1" bin img="$base/images"
  bin="$(bin_dir)"
  mkdir -p "$img/pause/root" "$img/test/root/bin"
  gcc -static -Os -o "$img/pause/root/pause" "$here/pause.c"
  python3 "$here/oci_image.py" --name localhost/gpulet/pause:test --entrypoint /pause \
    --layer "$img/pause/root" "$img/pause.tar"
  cp /bin/busybox "$img/test/root/bin/busybox"
  for t in sh env cat ls sleep echo grep stat head tail wc id test true false readlink find; do
    ln -sf busybox "$img/test/root/bin/$t"
  done
  python3 "$here/oci_image.py" --name localhost/gpulet/test:test --cmd /bin/sh --layer "$img/test/root" "$img/test.tar"
  local tars=("$img/pause.tar" "$img/test.tar")
  if [ -n "$build" ] && [ -x "$build/gpulet" ]; then
    "$here/gpulet_image.sh" "$build" "$img/gpulet.tar" "$img/cuda-test.tar"
    tars+=("$img/gpulet.tar")
    [ -f "$img/cuda-test.tar" ] && tars+=("$img/cuda-test.tar")
  fi
  for t in "${tars[@]}"; do
    "$bin/ctr" --address "$run/containerd/containerd.sock" -n k8s.io images import --platform linux/amd64 "$t" >/dev/null
  done
}

node_layer() {
  local bin="$1" build="$2"
  log "layer 3/3: node (kubelet $node, registered, Ready)"
  if [ ! -d "$kubelet_root" ]; then mkdir -p "$kubelet_root"; touch "$kubelet_root/$marker_name"; fi
  # The shipped manifests' hostPaths (DirectoryOrCreate): made here so that teardown removes them.
  for d in /var/log/pods /var/log/containers /etc/cdi /var/run/cdi /run/nvidia/mps /run/gpulet/dra /run/gpulet/memory \
           /usr/lib/gpulet /etc/kubernetes/node-feature-discovery/features.d; do make_path "$d"; done
  mkdir -p "$base/static-pods"
  # The simulated GPUs' device nodes: character devices with /dev/null's numbers (harmless) under
  # the cluster's own driver root, never the host's /dev. Allocate and CDI specs name them there.
  local dr="$run/driver-root/dev"
  mkdir -p "$dr/nvidia-caps" "$run/driver-root/proc/driver/nvidia/capabilities"
  for n in nvidiactl nvidia-uvm $(seq -f 'nvidia%g' 0 7); do mknod -m 666 "$dr/$n" c 1 3; done
  # MIG capability nodes for 8 GPUs as the driver numbers them (minors 1 to 3 + 7*135 + 14*9 + 8:
  # 15 GPU instances of 9 nodes each per GPU; testing/sim/simulation.cc writes the same mig-minors).
  python3 -c 'import os, stat, sys
for n in range(1, 1083): os.mknod("%s/nvidia-cap%d" % (sys.argv[1], n), 0o444 | stat.S_IFCHR, os.makedev(1, 3))' \
    "$dr/nvidia-caps"
  # The DRA DaemonSet mounts the driver root with HostToContainer propagation, which needs a shared
  # or slave mount; "/" is private on this VM (systemd hosts make it shared), so the root is a
  # shared bind mount of itself (unmounted by teardown with everything under the run directory).
  # The simulated driver's libraries under the names a driver installs (libcuda.so.VERSION and its
  # soname link), for the DRA driver's CDI specs to inject: the simulated CUDA driver and NVML.
  local lib="$run/driver-root/usr/lib/x86_64-linux-gnu" ver
  ver="$(sed -n 's/^driver_version: *//p' "$repo/testing/fixtures/dgx-h100.yaml")"
  mkdir -p "$lib"
  if [ -f "$build/cuda_sim/libcuda.so.1" ] && [ -f "$build/sim/libnvidia-ml.so.1" ]; then
    cp "$build/cuda_sim/libcuda.so.1" "$lib/libcuda.so.$ver"
    cp "$build/sim/libnvidia-ml.so.1" "$lib/libnvidia-ml.so.$ver"
    ln -s "libcuda.so.$ver" "$lib/libcuda.so.1"
    ln -s "libnvidia-ml.so.$ver" "$lib/libnvidia-ml.so.1"
    # The simulated NVML's YAML reader, which it loads from its own directory when it has no parsed
    # copy of its fixture (a container's first NVML call).
    [ -f "$build/sim/libgpulet-sim-yaml.so" ] && cp "$build/sim/libgpulet-sim-yaml.so" "$lib/"
    # The stand-in MPS control program (testing/mps), where the driver installs the real one.
    mkdir -p "$run/driver-root/usr/bin"
    [ -f "$build/mps/nvidia-cuda-mps-control" ] && cp "$build/mps/nvidia-cuda-mps-control" "$run/driver-root/usr/bin/"
  fi
  mount --bind "$run/driver-root" "$run/driver-root"
  mount --make-rshared "$run/driver-root"
  cat > "$base/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$run/containerd/containerd.sock
address: $gw
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
failSwapOn: false
tlsCertFile: $base/pki/kubelet-serving.crt
tlsPrivateKeyFile: $base/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $base/pki/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
clusterDNS: [$gw]
clusterDomain: cluster.local
staticPodPath: $base/static-pods
protectKernelDefaults: false
serializeImagePulls: false
EOF
  start_kubelet_and_wait "$bin"
  log "layer 3/3: node $node Ready"
}

start_kubelet() {
  local bin="$1"
  start kubelet "$bin/kubelet" --config "$base/kubelet.yaml" --kubeconfig "$base/kubelet.kubeconfig" \
    --hostname-override "$node" --node-ip "$gw" --root-dir "$kubelet_root" --v=1
}

start_kubelet_and_wait() {
  local bin="$1"
  start_kubelet "$bin"
  wait_for 60 kubelet-health curl -sf http://127.0.0.1:10248/healthz || layer_failed "node: kubelet health" kubelet containerd
  wait_for 90 node-ready "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" wait --for=condition=Ready \
    "node/$node" --timeout=5s || layer_failed "node: Ready" kubelet containerd
}

start_scheduler() {
  local bin="$1"
  start kube-scheduler "$bin/kube-scheduler" --config "$base/scheduler.yaml" \
    --authentication-kubeconfig "$base/scheduler.kubeconfig" --authorization-kubeconfig "$base/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=$sched_port --profiling=false --v=1
}

# restart kubelet|kube-scheduler: stop it (SIGTERM) and start it again with its configuration
# (the scheduler's rewritten first when GPULET_CLUSTER_SCHEDULER_EXTRA or
# GPULET_CLUSTER_SCHEDULER_QPS is set).
restart() {
  local bin; bin="$(bin_dir)"
  case "${1:-}" in
    kubelet) kill_pidfile kubelet; start_kubelet "$bin";;
    kube-scheduler)
      kill_pidfile kube-scheduler
      if [ -n "${GPULET_CLUSTER_SCHEDULER_QPS:-}" ]; then
        local q="$GPULET_CLUSTER_SCHEDULER_QPS"
        case "$q" in ''|*[!0-9]*) die "GPULET_CLUSTER_SCHEDULER_QPS must be a whole number, got '$q'";; esac
        sed -i -E "s/^  qps: .*/  qps: $q/; s/^  burst: .*/  burst: $((2 * q))/" "$base/scheduler.yaml"
      fi
      if [ -n "${GPULET_CLUSTER_SCHEDULER_EXTRA:-}" ]; then
        sed -i '/^# extra$/,$d' "$base/scheduler.yaml"
        { echo "# extra"; cat "$GPULET_CLUSTER_SCHEDULER_EXTRA"; } >> "$base/scheduler.yaml"
      fi
      start_scheduler "$bin"
      wait_for 60 scheduler curl -skf "https://127.0.0.1:$sched_port/healthz" || layer_failed "kube-scheduler restart" kube-scheduler;;
    *) die "restart: only the kubelet and kube-scheduler can be restarted";;
  esac
}

up() {
  local with_node=1 build="${GPULET_BUILD_DIR:-$repo/build}"
  while [ $# -gt 0 ]; do
    case "$1" in
      --no-node) with_node=0;;
      --build) build="$2"; shift;;
      *) die "up: unknown argument $1";;
    esac
    shift
  done
  down 2>/dev/null || true     # a leftover of an earlier run is cleaned first
  preflight
  local bin t0=$SECONDS
  bin="$(bin_dir)" || die "build of upstream components failed"
  mkdir -p "$base/logs" "$run/pids"
  : > "$run/made-paths"
  [ "$instance" = 0 ] && sysctl -qw vm.overcommit_memory=1 kernel.panic=10 kernel.panic_on_oops=1 2>/dev/null || true
  [ "$instance" = 0 ] || with_node=0
  if [ "$instance" = 0 ]; then
    # The bridge first: the API server listens on its gateway address.
    ip link add "$bridge" type bridge
    ip addr add "$gw/16" dev "$bridge"
    ip link set "$bridge" up
  fi
  pki
  for k in admin kubelet controller-manager scheduler coredns; do kubeconfig "$k"; done
  control_plane "$bin"
  if [ "$with_node" = 1 ]; then
    runtime "$bin" "$build"
    node_layer "$bin" "$build"
  fi
  log "up in $((SECONDS - t0)) s"
  echo "export KUBECONFIG=$base/admin.kubeconfig"
  log "kubectl: export KUBECONFIG=$base/admin.kubeconfig PATH=$bin:\$PATH; kubectl get nodes"
}

status() {
  [ -f "$base/admin.kubeconfig" ] || { echo "no cluster (cluster.sh up starts one)"; return 1; }
  local bin; bin="$(bin_dir)"
  for p in "$run"/pids/*; do
    [ -f "$p" ] && printf '%-24s pid %s %s\n' "$(basename "$p")" "$(cat "$p")" \
      "$(kill -0 "$(cat "$p")" 2>/dev/null && echo running || echo STOPPED)"
  done
  echo "KUBECONFIG=$base/admin.kubeconfig"
  "$bin/kubectl" --kubeconfig "$base/admin.kubeconfig" get nodes -o wide
}

env_lines() {
  local bin; bin="$(bin_dir)"
  cat <<EOF
export KUBECONFIG=$base/admin.kubeconfig
export PATH=$bin:\$PATH
export GPULET_CLUSTER_BASE=$base GPULET_CLUSTER_RUN=$run GPULET_CLUSTER_NODE=$node GPULET_CLUSTER_API=$api
export GPULET_CLUSTER_CONTAINERD=$run/containerd/containerd.sock GPULET_CLUSTER_BIN=$bin
export GPULET_CLUSTER_INSTANCE=$instance
EOF
}

case "${1:-}" in
  up) shift; up "$@";;
  down) down;;
  status) status;;
  env) env_lines;;
  images) shift; images "${1:-$repo/build}";;
  restart) shift; restart "$@";;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2;;
esac
