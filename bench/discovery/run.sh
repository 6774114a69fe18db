#!/usr/bin/env bash
# Discovery of dgx-a100 (with MIG), dgx-h100 and synthetic-64 on the simulated driver.
set -euo pipefail
state=$(mktemp -d /tmp/gpulet-bench-discovery-XXXXXX)
out=$(mktemp)
trap 'rm -rf "$state" "$out"' EXIT
"$BUILD/bin/bench_discovery" "$BUILD/gpulet" "$state" "${RUNS:-200}" | tee "$out"
{ echo "## Discovery (issue 2)"; echo; cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" discovery "$out.md"
rm -f "$out.md"
