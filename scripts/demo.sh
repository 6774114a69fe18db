#!/usr/bin/env bash
# make demo: gpulet on simulated GPUs. Each step prints what it shows; nothing here needs a GPU.
set -euo pipefail
BUILD=${1:-build}
GPULET="$BUILD/gpulet"
STATE=$(mktemp -d /tmp/gpulet-demo-XXXXXX)
cleanup() {
  # Stop everything this demo started, by pid.
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$STATE"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
# Prints a command as it can be pasted (from the repository root), then runs it in this shell.
run() {
  printf '$ %s\n' "$1"
  eval "$1"
}

step "Inventory of a simulated DGX H100"
run "$GPULET info --simulate dgx-h100"

step "Inventory of a simulated DGX A100 with two GPUs in MIG mode"
run "$GPULET info --simulate dgx-a100"

step "The same inventory as JSON (first GPU)"
run "$GPULET info --simulate dgx-h100 --output json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps(d[\"gpus\"][0], indent=2)); print(\"gpu_count:\", d[\"gpu_count\"])'"

# Later sections (device plugin, sharing, exporter, Slurm) are appended by scripts/demo.d/*.sh.
for part in "$(dirname "$0")"/demo.d/*.sh; do
  [ -e "$part" ] || continue
  # shellcheck source=/dev/null
  source "$part"
done
step "Demo finished"
