#!/usr/bin/env bash
# Metrics on the real cluster (issue 32, item 7): Debian's Prometheus scrapes the deployed agent
# over the pod network; its GPU series carry the pod, namespace and container of the pods holding
# each GPU, read from the real kubelet's pod-resources API; the shipped alert rules load.
source "$(dirname "$0")/lib.sh"
ns=gpulet-test-metrics
work="$(mktemp -d)"
prom_pid=""
cleanup() { [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
command -v prometheus >/dev/null || { [ "${CI:-}" = true ] && fail "prometheus not installed (make deps)"; echo "SKIP: no prometheus"; exit 77; }

kc apply -k "$repo/testing/cluster/overlays/sim-dgx-h100" >/dev/null 2>&1
until_true 120 "the agent pod Ready" agent_ready
until_true 60 "allocatable 8" allocatable_is 8
fresh_namespace "$ns"
gpu_pod "$ns" m-0 1
gpu_pod "$ns" m-1 1
until_true 120 "m-0 Running" pod_phase_is "$ns" m-0 Running
until_true 120 "m-1 Running" pod_phase_is "$ns" m-1 Running
until_true 30 "m-0 printed its environment" logs_have "$ns" m-0 '^DEV:'
until_true 30 "m-1 printed its environment" logs_have "$ns" m-1 '^DEV:'

ip="$(kc get pod -n gpulet-system "$(agent_pod)" -o jsonpath='{.status.podIP}')"
say "Prometheus scrapes the agent at $ip:9400 over the pod network, with the shipped rules"
cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$repo/deploy/prometheus/gpulet-rules.yaml"]
scrape_configs:
  - job_name: gpulet-exporter
    static_configs: [{targets: ["$ip:9400"]}]
YAML
port=$((19090 + RANDOM % 500))
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$port" > "$work/prometheus.log" 2>&1 &
prom_pid=$!
query() { curl -sf "http://127.0.0.1:$port/api/v1/query" --data-urlencode "query=$1"; }
for p in m-0 m-1; do
  uuid="$(kc logs -n "$ns" "$p" | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')"
  attributed() { grep -q "\"UUID\":\"$uuid\"" <<< "$(query "DCGM_FI_DEV_GPU_UTIL{namespace=\"$ns\",pod=\"$p\",container=\"main\"}")"; }
  until_true 60 "Prometheus has $p's GPU ($uuid) labelled with its pod" attributed
  echo "$p: DCGM_FI_DEV_GPU_UTIL{UUID=\"$uuid\", namespace=\"$ns\", pod=\"$p\", container=\"main\"}"
done
for p in m-0 m-1; do
  n="$(query "count(DCGM_FI_DEV_GPU_UTIL{namespace=\"$ns\",pod=\"$p\"})")"
  grep -q '"value":\[[0-9.]*,"1"\]' <<< "$n" || fail "want exactly one GPU labelled $p, got: $n"
done
rules_loaded() { grep -q '"groups":\[{' <<< "$(curl -sf "http://127.0.0.1:$port/api/v1/rules")"; }
until_true 30 "the shipped alert rules loaded" rules_loaded
echo "rules: $(curl -sf "http://127.0.0.1:$port/api/v1/rules" | grep -o '"name":"[A-Za-z]*"' | head -8 | tr '\n' ' ')"
kc delete namespace "$ns" --wait=false >/dev/null
echo PASS
