#!/usr/bin/env bash
# Pool broker: evaluation cost (1,000 nodes, 10,000 pending jobs, JSON parsing included) and the
# decision latency from the demand signal to the node usable in Kubernetes.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
"$BUILD/bin/bench_broker" "${RUNS:-40}" | tee "$out"
{ echo "## Pool broker (issue 8)"; echo; echo "Build: $(sed -n "s/^CMAKE_BUILD_TYPE:STRING=//p" "$BUILD/CMakeCache.txt")."; echo; cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" broker "$out.md"
