#!/usr/bin/env bash
# Device plugin: allocation latency (8 and 64 GPUs), health propagation, re-registration, RSS.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
GPULET_BUILD_DIR="$BUILD" "$BUILD/bin/bench_deviceplugin" "${RUNS:-2000}" | tee "$out"
{ echo "## Device plugin (issue 3)"; echo; cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" deviceplugin "$out.md"
