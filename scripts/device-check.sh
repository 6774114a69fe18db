#!/usr/bin/env bash
# Every check gpulet has against real hardware, in one run of under 8 minutes, with one report:
#   1 discovery      `gpulet info -o json` against `nvidia-smi -q -x` (UUID, name, memory, PCI bus
#                    id, minor number, MIG mode) for every GPU
#   2 exporter       `gpulet exporter` /metrics against nvidia-smi's own values (memory used,
#                    temperature, power) for every GPU
#   3 plugin         `gpulet plugin` registered with the kubelet harness (testing/kubelet): every
#                    GPU advertised healthy, one Allocate answered
#   4 xid events     the plugin's health monitor registered for XID events on every GPU (its log)
#   5 memory limits  scripts/device-check-memory-limits.sh (VMM, graphs, address reuse, arrays, …)
#   6 DRA prepare    bin/dra_device_check: a whole GPU's CDI spec against the host, an 8 GiB memory
#                    share's spec applied alone in a private mount namespace holds (CUDA program)
# It leaves the GPUs' settings as they were: it never changes MIG mode, compute mode, clocks,
# persistence mode, power limits or ECC, refuses to run nvidia-smi with any option that would, and
# compares a snapshot of those settings before and after (a difference fails the run).
#
# Usage: scripts/device-check.sh [BUILD_DIR]   (default: build; needs gpulet and
#        bin/gpulet-kubelet-harness there: `make`). Needs an NVIDIA GPU and driver, python3, curl;
#        step 5 also nvcc and g++. Writes everything under $OUT (default: a temporary directory),
#        the report to $OUT/report.txt and stdout.
# Exit status: 0 every step passed or was skipped, 1 a step failed, 2 not runnable here.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" 2> /dev/null && pwd) || { echo "not runnable: no build directory ${1:-$ROOT/build}"; exit 2; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
GPULET="$BUILD/gpulet"  # the CLI is built at the build root (src/cli/CMakeLists.txt)
[[ -x $GPULET ]] || GPULET="$BUILD/bin/gpulet"
HARNESS="$BUILD/bin/gpulet-kubelet-harness"
: > "$REPORT"
failed=0
started=$(date +%s)

say() { echo "$*" | tee -a "$REPORT"; }

# nvidia-smi, read-only: any option that changes a setting is refused, whoever asks.
smi() {
  local a
  for a in "$@"; do
    case "$a" in
      -mig | --multi-instance-gpu | -c | --compute-mode | -pm | --persistence-mode | \
        -e | --ecc-config | -p | --reset-ecc-errors | -r | --gpu-reset | -ac | --applications-clocks | \
        -rac | --reset-applications-clocks | -lgc | --lock-gpu-clocks | -rgc | --reset-gpu-clocks | \
        -lmc | --lock-memory-clocks | -rmc | --reset-memory-clocks | -pl | --power-limit | \
        -cc | --cuda-clocks | -am | --accounting-mode | -caa | --clear-accounted-apps | \
        -acp | --accounted-apps-permission | -dm | --driver-model | -fdm | --force-driver-model | \
        mig | -gom | --gom)
        echo "refused: nvidia-smi $* would change a GPU setting" >&2
        return 97
        ;;
    esac
  done
  timeout 60 nvidia-smi "$@"
}

settings() {
  smi --query-gpu=index,uuid,mig.mode.current,compute_mode,persistence_mode,power.limit,clocks.applications.graphics,clocks.applications.memory,ecc.mode.current \
    --format=csv,noheader
}

# step NAME SECONDS FUNCTION: runs FUNCTION with a time limit; its status 0 pass, 3 skip, else fail.
step() {
  local name=$1 limit=$2 fn=$3 log="$OUT/$1.log" t0 rc
  t0=$(date +%s)
  timeout "$limit" bash -c "$fn" > "$log" 2>&1  # exported functions reach the child shell
  rc=$?
  local took=$(($(date +%s) - t0))
  case $rc in
    0) say "PASS  $name (${took}s)" ;;
    3) say "SKIP  $name (${took}s): $(tail -1 "$log")" ;;
    124) say "FAIL  $name: over its ${limit}s budget (log: $log)"; failed=$((failed + 1)) ;;
    *) say "FAIL  $name (${took}s, log: $log)"; grep -E '^(FAIL|mismatch|error)' "$log" | head -20 | sed 's/^/      /' | tee -a "$REPORT"; failed=$((failed + 1)) ;;
  esac
}

export ROOT BUILD OUT GPULET HARNESS

discovery() {
  "$GPULET" info -o json > "$OUT/info.json" || { echo "error: gpulet info failed"; return 1; }
  smi -q -x > "$OUT/nvidia-smi.xml" || { echo "error: nvidia-smi -q -x failed"; return 1; }
  python3 - "$OUT/info.json" "$OUT/nvidia-smi.xml" << 'EOF'
import json, sys, xml.etree.ElementTree as ET
info = json.load(open(sys.argv[1]))
gpus = info["gpus"]
root = ET.parse(sys.argv[2]).getroot()
smi = {g.findtext("uuid"): g for g in root.findall("gpu")}
bad = 0
if len(gpus) != len(smi):
    print(f"mismatch: gpulet sees {len(gpus)} GPUs, nvidia-smi {len(smi)}"); bad += 1
for g in gpus:
    s = smi.get(g["uuid"])
    if s is None:
        print(f"mismatch: {g['uuid']} not in nvidia-smi"); bad += 1; continue
    total = int(s.findtext("fb_memory_usage/total").split()[0])
    bus = s.findtext("pci/pci_bus_id").lower()
    checks = {
        "name": (g["name"], s.findtext("product_name")),
        "memory_mib": (g["memory_mib"], total),
        "pci_bus_id": (g["pci_bus_id"].lower()[-12:], bus[-12:]),
        "minor": (str(g["minor"]), s.findtext("minor_number")),
    }
    mig = s.findtext("mig_mode/current_mig")
    if mig in ("Enabled", "Disabled"):
        checks["mig_enabled"] = (g["mig_enabled"], mig == "Enabled")
    for k, (ours, theirs) in checks.items():
        if ours != theirs:
            print(f"mismatch: {g['uuid']} {k}: gpulet {ours!r}, nvidia-smi {theirs!r}"); bad += 1
    print(f"gpu {g['uuid']}: {', '.join(checks)} compared")
print(f"driver: gpulet {info['driver_version']}, nvidia-smi {root.findtext('driver_version')}")
if info["driver_version"] != root.findtext("driver_version"):
    print("mismatch: driver version"); bad += 1
sys.exit(1 if bad else 0)
EOF
}

exporter() {
  local port=$((20000 + RANDOM % 20000)) pid ok=0
  "$GPULET" exporter -a "127.0.0.1:$port" -c 1000 > "$OUT/exporter.out" 2>&1 &
  pid=$!
  for _ in $(seq 1 60); do
    if curl -sf "http://127.0.0.1:$port/metrics" > "$OUT/metrics.txt"; then ok=1; break; fi
    sleep 0.5
  done
  if [[ $ok -ne 1 ]]; then kill "$pid"; echo "error: no /metrics on port $port"; return 1; fi
  sleep 2  # one more collection, then read both sides as close together as possible
  curl -sf "http://127.0.0.1:$port/metrics" > "$OUT/metrics.txt"
  smi --query-gpu=uuid,memory.used,temperature.gpu,power.draw --format=csv,noheader,nounits > "$OUT/smi-values.csv"
  kill "$pid"
  wait "$pid" 2> /dev/null
  python3 - "$OUT/metrics.txt" "$OUT/smi-values.csv" << 'EOF'
import re, sys
series = {}
for line in open(sys.argv[1]):
    m = re.match(r'^(\w+)\{([^}]*)\}\s+(\S+)', line)
    if not m:
        continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
    if "UUID" in labels:
        series[(m.group(1), labels["UUID"])] = float(m.group(3))
bad = 0
for row in open(sys.argv[2]):
    uuid, used, temp, power = [x.strip() for x in row.split(",")]
    for field, theirs, tol in (("DCGM_FI_DEV_FB_USED", used, lambda v: max(64, v * 0.02)),
                               ("DCGM_FI_DEV_GPU_TEMP", temp, lambda v: 3),
                               ("DCGM_FI_DEV_POWER_USAGE", power, lambda v: max(15, v * 0.15))):
        if theirs in ("[N/A]", "N/A", "[Not Supported]"):
            continue
        ours = series.get((field, uuid))
        if ours is None:
            print(f"mismatch: {field} for {uuid} not exported"); bad += 1; continue
        v = float(theirs)
        if abs(ours - v) > tol(v):
            print(f"mismatch: {field} {uuid}: exporter {ours}, nvidia-smi {v}"); bad += 1
        else:
            print(f"{field} {uuid}: exporter {ours}, nvidia-smi {v}")
sys.exit(1 if bad else 0)
EOF
}

plugin() {
  local dir="$OUT/device-plugins" n hpid ppid rc
  mkdir -p "$dir"
  n=$(smi -L | grep -c '^GPU ')
  "$HARNESS" --dir "$dir" --resource nvidia.com/gpu --expect "$n" --allocate 1 --timeout 60 > "$OUT/harness.out" 2>&1 &
  hpid=$!
  sleep 1
  "$GPULET" plugin --device-plugin-path "$dir" > "$OUT/plugin.out" 2>&1 &
  ppid=$!
  wait "$hpid"
  rc=$?
  kill "$ppid" 2> /dev/null
  wait "$ppid" 2> /dev/null
  cat "$OUT/harness.out"
  [[ $rc -eq 0 ]] || { echo "error: the kubelet harness did not see $n healthy GPUs and an Allocate (exit $rc)"; return 1; }
}

xid_events() {
  local log="$OUT/plugin.out"
  [[ -s $log ]] || { echo "error: no plugin log (step plugin did not run)"; return 1; }
  grep -E 'event=health_(monitor_started|events_unavailable|register_failed|handle_failed|checks_disabled)' "$log"
  if grep -qE 'event=health_(events_unavailable|register_failed|handle_failed)' "$log"; then
    echo "error: XID event registration failed on some GPU (see above)"
    return 1
  fi
  grep -q 'event=health_monitor_started' "$log" || { echo "error: the health monitor never started"; return 1; }
}

memory_limits() {
  OUT="$OUT/memory-limits" bash "$ROOT/scripts/device-check-memory-limits.sh"
  local rc=$?
  if [[ $rc -eq 2 ]]; then echo "not runnable here (nvcc, g++ or the GPU missing)"; return 3; fi
  return $rc
}

# Issue 36 on the real driver, with what step memory-limits built: an honest program that finds
# the driver's functions with dlsym(RTLD_DEFAULT); a GPULET_CUDA_DRIVER_LIBRARY in the process
# environment (ignored: the node decides); the driver's descriptors kept across exec (the earlier
# image's charge stays until the process exits).
memory_limits_36() {
  local bin="$OUT/memory-limits/bin" acct="$OUT/memory-limits-36" rc=0 out uuid a b
  local limit=$((4096 << 20))
  [[ -x $bin/memlimit_probe && -f $bin/libgpulet-cuda.so ]] || { echo "no $bin: step memory-limits builds it"; return 3; }
  uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
  mkdir -p "$acct"
  fresh() { "$bin/gpulet-cuda-region" create "$acct" "$uuid=$limit" > /dev/null && cp "$acct/gpulet-cuda.limits" "$bin/gpulet-cuda.limits"; }
  probe() { CUDA_VISIBLE_DEVICES=0 GPULET_CUDA_DIR="$acct" LD_PRELOAD="$bin/libgpulet-cuda.so" timeout 60 "$@" 2>&1; }
  fresh; out=$(probe "$bin/memlimit_probe" rtlddefault $((1 << 20))); echo "$out"
  if echo "$out" | grep -q 'rtlddefault init_rc=0 alloc_rc=0'; then echo "PASS dlsym(RTLD_DEFAULT) reaches the driver"; else echo "FAIL dlsym(RTLD_DEFAULT)"; rc=1; fi
  fresh; out=$(GPULET_CUDA_DRIVER_LIBRARY=/nonexistent/libcuda.so.1 probe "$bin/memlimit_probe" init alloc alloc $((1 << 20))); echo "$out"
  if echo "$out" | grep -q 'init rc=0' && echo "$out" | grep -q 'alloc api=alloc rc=0'; then echo "PASS GPULET_CUDA_DRIVER_LIBRARY ignored"; else echo "FAIL GPULET_CUDA_DRIVER_LIBRARY"; rc=1; fi
  fresh; out=$(probe "$bin/memlimit_probe" init alloc alloc $((256 << 20)) exec init info); echo "$out"
  a=$(echo "$out" | sed -n 's/.*\bcu_free=\([0-9]*\).*/\1/p' | tail -1)
  fresh; out=$(probe "$bin/memlimit_probe" init alloc alloc $((256 << 20)) inherit exec init info); echo "$out"
  b=$(echo "$out" | sed -n 's/.*\bcu_free=\([0-9]*\).*/\1/p' | tail -1)
  if [[ -n $a && -n $b && $((a - b)) -ge $((256 << 20)) ]]; then echo "PASS descriptors kept across exec keep the charge ($((a - b)) bytes)"; else echo "FAIL descriptors kept across exec: free ${a:-?} without, ${b:-?} with"; rc=1; fi
  return $rc
}

# The DRA preparer on the real driver (bin/dra_device_check): a whole GPU's CDI spec checked
# against the host (device nodes, driver files), then an 8 GiB memory share of GPU 0 whose spec is
# applied alone in a private mount namespace (its mounts, its environment, no LD_PRELOAD of ours):
# the CUDA program built by step memory-limits gets 8 GiB and not a byte more; the share is then
# unprepared from its record. Mount targets this step had to create are removed afterwards.
dra_prepare() {
  local tool="$BUILD/bin/dra_device_check" dir="$OUT/dra" lib="$BUILD/lib/libgpulet-cuda.so"
  local runtime="$OUT/memory-limits/bin/memlimit_runtime" spec rc=0 out admitted err limit=$((8192 << 20))
  [[ -x $tool ]] || { echo "no $tool (make)"; return 3; }
  [[ -f $lib ]] || { echo "no $lib (make)"; return 3; }
  [[ -x $runtime ]] || { echo "no $runtime: step memory-limits builds it"; return 3; }
  mkdir -p "$dir"
  "$tool" prepare --state "$dir/state" --cdi "$dir/cdi" --library "$lib" --share-mib 8192 | tee "$dir/prepare.out"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
  spec=$(sed -n 's/^spec=//p' "$dir/prepare.out")
  [[ -n $spec ]] || { echo "error: no memory-share spec prepared"; return 1; }
  cp "$spec" "$dir/share-spec.json"
  python3 - "$spec" "$runtime" > "$dir/container.sh" << 'PY'
import json, shlex, sys
spec, runtime = json.load(open(sys.argv[1])), sys.argv[2]
edits = [spec.get("containerEdits", {})] + [d.get("containerEdits", {}) for d in spec["devices"]]
env, lines = [], ["set -e", "mount --make-rprivate /"]
for e in edits:
    env += e.get("env", [])
    for m in e.get("mounts", []):
        src, dst = m["hostPath"], m["containerPath"]
        q = shlex.quote
        lines.append(f"if [ -d {q(src)} ]; then mkdir -p {q(dst)}; else mkdir -p $(dirname {q(dst)}); [ -e {q(dst)} ] || {{ : > {q(dst)}; echo {q(dst)} >> \"$CREATED\"; }}; fi")
        lines.append(f"mount --bind {q(src)} {q(dst)}")
        if "ro" in m.get("options", []):
            lines.append(f"mount -o remount,bind,ro {q(dst)}")
lines.append("exec env -i PATH=/usr/bin:/bin " + " ".join(shlex.quote(v) for v in env) +
             f" {shlex.quote(runtime)} malloc {64 << 20}")
print("\n".join(lines))
PY
  export CREATED="$dir/created"
  : > "$CREATED"
  out=$(unshare -m bash "$dir/container.sh" 2>&1)
  echo "$out"
  while read -r f; do [[ -n $f ]] && rm -f "$f"; done < "$CREATED"
  admitted=$(echo "$out" | sed -n 's/.*\badmitted=\([0-9]*\).*/\1/p' | tail -1)
  err=$(echo "$out" | sed -n 's/^malloc .*\berr=\([^ ]*\).*/\1/p' | tail -1)
  if [[ ${admitted:-0} -gt 0 && ${admitted:-0} -le $limit ]]; then echo "PASS the share holds: admitted $admitted of $limit bytes"; else echo "FAIL the share holds: admitted ${admitted:-none} of $limit bytes"; rc=1; fi
  if [[ $err == cudaErrorMemoryAllocation ]]; then echo "PASS past the share: out of memory"; else echo "FAIL past the share: ${err:-no answer}"; rc=1; fi
  if [[ $((limit - ${admitted:-0})) -lt $(((64 << 20) + (2048 << 20))) ]]; then echo "PASS less than one chunk plus the context left unused"; else echo "FAIL the share left $((limit - ${admitted:-0})) bytes unused"; rc=1; fi
  "$tool" unprepare --state "$dir/state" --cdi "$dir/cdi" --library "$lib" || rc=1
  return $rc
}

export -f smi discovery exporter plugin xid_events memory_limits memory_limits_36 dra_prepare

command -v nvidia-smi > /dev/null || { echo "not runnable: nvidia-smi not found"; exit 2; }
smi -L > /dev/null || { echo "not runnable: no GPU"; exit 2; }
for tool in python3 curl; do
  command -v "$tool" > /dev/null || { echo "not runnable: $tool not found"; exit 2; }
done
[[ -x $GPULET && -x $HARNESS ]] || { echo "not runnable: $GPULET or $HARNESS missing (make)"; exit 2; }

say "gpulet device check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo unknown)"
smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/  /' | tee -a "$REPORT"
settings > "$OUT/settings.before"

step discovery 60 discovery
step exporter 60 exporter
step plugin 90 plugin
step xid-events 10 xid_events
step memory-limits 240 memory_limits
step memory-limits-36 90 memory_limits_36
step dra-prepare 60 dra_prepare

settings > "$OUT/settings.after"
if diff -u "$OUT/settings.before" "$OUT/settings.after" > "$OUT/settings.diff"; then
  say "PASS  GPU settings unchanged (MIG mode, compute mode, persistence, power limit, clocks, ECC)"
else
  say "FAIL  GPU settings changed:"
  sed 's/^/      /' "$OUT/settings.diff" | tee -a "$REPORT"
  failed=$((failed + 1))
fi
say "== $failed failed step(s) in $(($(date +%s) - started))s; logs in $OUT"
[[ $failed -eq 0 ]]
