#!/usr/bin/env bash
# The real cluster (docs/real-cluster.md): pod created -> Running with one GPU through gpulet's
# device plugin (p50/p99 over N pods, one at a time), the kubelet restart -> allocatable back, and
# the agent's RSS on the real node. Brings the cluster up, deploys gpulet from its manifests, and
# takes it all down. Needs root and Go (as the cluster tier); skipped otherwise.
set -euo pipefail
: "${BUILD:?}" "${ROOT:?}"
if [ "$(id -u)" != 0 ] || ! PATH=/usr/local/go/bin:$PATH command -v go >/dev/null; then
  echo "bench cluster: skipped (needs root and Go >= 1.26)"; exit 0
fi
export PATH=/usr/local/go/bin:$PATH
N="${CLUSTER_PODS:-50}"
cluster="$ROOT/testing/cluster/cluster.sh"
out="$(mktemp)"
trap '"$cluster" down >/dev/null 2>&1 || true; rm -f "$out" "$out.md"' EXIT
t0=$SECONDS
"$cluster" up --build "$BUILD" >/dev/null
up_s=$((SECONDS - t0))
eval "$("$cluster" env)"
node="$GPULET_CLUSTER_NODE"
kubectl label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
kubectl apply -k "$ROOT/testing/cluster/overlays/sim-dgx-h100" >/dev/null
kubectl -n gpulet-system rollout status daemonset/gpulet --timeout=180s >/dev/null
until [ "$(kubectl get node "$node" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" = 8 ]; do sleep 0.2; done
kubectl create namespace bench >/dev/null
until kubectl get serviceaccount -n bench default >/dev/null 2>&1; do sleep 0.2; done

pod() {
  cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: bench}
spec:
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: localhost/gpulet/test:test
      imagePullPolicy: Never
      command: ["/bin/sleep", "100000"]
      resources: {limits: {nvidia.com/gpu: 1}}
YAML
}
ms=()
for i in $(seq 1 "$N"); do
  a=$(date +%s%N)
  pod "p$i" | kubectl create -f - >/dev/null
  kubectl wait -n bench --for=jsonpath='{.status.phase}'=Running "pod/p$i" --timeout=120s >/dev/null
  b=$(date +%s%N)
  ms+=($(( (b - a) / 1000000 )))
  kubectl delete pod -n bench "p$i" --wait=false >/dev/null
done
pct() { printf '%s\n' "${ms[@]}" | sort -n | awk -v p="$1" '{v[NR]=$1} END {i=int((NR*p+99)/100); if (i<1) i=1; print v[i]}'; }

# Kubelet restart -> the plugin registered again on the new kubelet.sock (gpulet's
# event=registered line in its container log, read from the node's log file) and allocatable 8.
kubectl delete pods -n bench --all --wait=true --timeout=120s >/dev/null
agent_log() { cat /var/log/pods/gpulet-system_gpulet-*/gpulet/*.log 2>/dev/null | grep -c 'event=registered' || true; }
n0="$(agent_log)"
a=$(date +%s%N)
"$cluster" restart kubelet
until curl -sf http://127.0.0.1:10248/healthz >/dev/null; do sleep 0.02; done
b=$(date +%s%N)
until [ "$(agent_log)" -gt "$n0" ]; do sleep 0.02; done
c=$(date +%s%N)
until [ "$(kubectl get node "$node" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" = 8 ]; do sleep 0.1; done

rss=""
for p in $(pgrep -x gpulet); do
  args="$(tr '\0' ' ' < "/proc/$p/cmdline")"
  case "$args" in *" node "*) rss="$(awk '/VmRSS/{printf "%.1f", $2/1024}' "/proc/$p/status")";; esac
done
{
  echo "## Real cluster: pod start through the device plugin, kubelet restart, agent RSS (issue 32)"
  echo
  echo "Kubernetes $(kubectl version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])'),"
  echo "containerd, runc $(runc --version | head -1 | awk '{print $3}'), one node, simulated DGX H100,"
  echo "gpulet deployed with \`kubectl apply -k testing/cluster/overlays/sim-dgx-h100\`. Bring-up"
  echo "(binaries cached): $up_s s. Pod timing is client-side, \`kubectl create\` to \`kubectl wait\`"
  echo "seeing phase Running (it includes two kubectl start-ups, about 0.1 s)."
  echo
  echo "| figure | value |"
  echo "|---|---|"
  echo "| pod created -> Running, one nvidia.com/gpu, $N pods one at a time: p50 | $(pct 50) ms |"
  echo "| same: p99 | $(pct 99) ms |"
  echo "| same: min / max | $(printf '%s\n' "${ms[@]}" | sort -n | head -1) / $(printf '%s\n' "${ms[@]}" | sort -n | tail -1) ms |"
  echo "| kubelet restart: SIGTERM to healthz | $(( (b - a) / 1000000 )) ms |"
  echo "| kubelet healthy -> gpulet registered again | $(( (c - b) / 1000000 )) ms |"
  echo "| \`gpulet node\` RSS in its pod on the real node (8 GPUs) | ${rss:-?} MiB |"
} > "$out.md"
cat "$out.md"
python3 "$ROOT/bench/update_section.py" cluster "$out.md"
bash "$ROOT/bench/cluster/dra.sh"  # DRA claims on the same cluster (it is still up)
