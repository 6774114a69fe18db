# Sourced by scripts/demo.sh: what users check first on a node, each command printed as it can be
# pasted (from the repository root, while the demo runs or after it): the dcgm-exporter check
# every guide starts with, gpulet doctor, the Slurm lines, and an alert firing on an injected XID.
# Uses $GPULET, $BUILD, $STATE, step() and run() from demo.sh.

# A simulated node of its own, so nothing above interferes; the same --sim-state in every command.
USIM="/tmp/gpulet-demo-node"
rm -rf "$USIM" 2>/dev/null || true
PORT=9400
if ! python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $PORT))" 2>/dev/null; then
  PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
fi

step "The exporter, checked the way every dcgm-exporter guide starts"
mkdir -p "$BUILD/demo"
run "$GPULET exporter --simulate dgx-h100 --sim-state $USIM -a 127.0.0.1:$PORT -c 1000 >$BUILD/demo/exporter.log 2>&1 &"
EXPORTER_PID=$!
for _ in $(seq 50); do
  curl -sf "localhost:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.2
done
run "curl -s localhost:$PORT/metrics | grep -E \"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_MEM_COPY_UTIL|DCGM_FI_DEV_GPU_TEMP\""

step "An alert firing: XID 79 (GPU fell off the bus) injected on GPU 3"
run "$GPULET sim xid --simulate dgx-h100 --sim-state $USIM --gpu 3 --code 79"
XID_LINE=""
for _ in $(seq 50); do
  XID_LINE=$(curl -s "localhost:$PORT/metrics" | grep -E '^DCGM_FI_DEV_XID_ERRORS\{gpu="3".*err_code="79"' || true)
  [ -n "$XID_LINE" ] && break
  sleep 0.2
done
run "curl -s localhost:$PORT/metrics | grep -E '^DCGM_FI_DEV_XID_ERRORS\\{gpu=\"3\"'"
if command -v promtool >/dev/null && [ -n "$XID_LINE" ]; then
  # The scraped series, fed to the shipped rules: GpuFatalXid fires at once (critical).
  SERIES=${XID_LINE% *}
  ALERT_TEST="$BUILD/demo/xid-alert.test.yaml"
  mkdir -p "$BUILD/demo"
  SERIES="$SERIES" RULES="$(pwd)/deploy/prometheus/gpulet-rules.yaml" python3 - >"$ALERT_TEST" <<'PY'
import json, os, re
series, rules = os.environ["SERIES"], os.environ["RULES"]
labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
exp = {"severity": "critical", **labels}
print("# The series gpulet exporter published after the injected XID, against the shipped rules.")
print(json.dumps({
    "rule_files": [rules], "evaluation_interval": "1m",
    "tests": [{"interval": "1m",
               "input_series": [{"series": series, "values": "79x5"}],
               "alert_rule_test": [{"eval_time": "1m", "alertname": "GpuFatalXid",
                                    "exp_alerts": [{"exp_labels": exp, "exp_annotations": {
                                        "summary": f"GPU {labels['gpu']} on {labels['Hostname']}: XID 79 ({labels['err_msg']})",
                                        "description": f"Last XID of {labels['UUID']} is 79: {labels['err_msg']}. Drain the node and check the GPU."}}]}]}]},
    indent=2))
PY
  run "promtool test rules $ALERT_TEST"
else
  echo "(promtool not installed: the rules' own tests are in deploy/prometheus/gpulet-rules.test.yaml)"
fi
kill "$EXPORTER_PID" 2>/dev/null || true
wait "$EXPORTER_PID" 2>/dev/null || true

step "gpulet doctor: the new-node checklist (a simulated node has no /dev/nvidia* or kubelet: each failure says how to fix it)"
run "$GPULET doctor --simulate dgx-h100 --sim-state $USIM || true"

step "Slurm: gres.conf and the slurm.conf line from the same discovery"
run "$GPULET slurm gres --simulate dgx-h100 --sim-state $USIM"

step "Drop-in: NVIDIA's files load as they are (docs/compatibility.md)"
if [ -f ../shared/upstream/mig-parted/config-default.yaml ]; then
  run "$GPULET mig plan --simulate dgx-h100 --sim-state $USIM -f ../shared/upstream/mig-parted/config-default.yaml -c all-balanced | sed -n 1,7p"
fi
run "$GPULET labels --simulate dgx-h100 --sim-state $USIM --oneshot --output-file - | grep -E 'gpu.(family|product|machine|mode)='"
run "$GPULET infp || true"
rm -rf "$USIM" 2>/dev/null || true
