#!/usr/bin/env bash
# Scheduler extender (issue 14): filter + prioritize latency at 1,000 and 5,000 nodes × 8 GPUs in
# node-cache mode through real HTTP, and bind throughput against the fake API server.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
"$BUILD/bin/bench_extender" "${RUNS:-200}" "${PODS:-2000}" | tee "$out"
{ echo "## Scheduler extender (issue 14)"; echo; echo "Build: $(sed -n "s/^CMAKE_BUILD_TYPE:STRING=//p" "$BUILD/CMakeCache.txt"). Targets: p99 < 5 ms at 5,000 nodes; >= 500 binds/s."; echo; cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" extender "$out.md"
