#!/usr/bin/env bash
# Footprint (hardening issue): RSS of gpulet plugin and gpulet node under the kubelet harness.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
python3 "$ROOT/bench/footprint/footprint_bench.py" "$BUILD" "${ROUNDS:-3}" | tee "$out"
{
  echo "## Footprint (issue 12)"
  echo
  echo "\`gpulet plugin\` and \`gpulet node\` on a simulated DGX H100, registered with the kubelet"
  echo "harness (ListAndWatch open, one Allocate), measured 8 s after start; ${ROUNDS:-3} rounds."
  echo "Target: \`gpulet node\` below 16 MiB RSS. NVIDIA's Go plugin v0.13.0 held 23.4-23.6 MiB"
  echo "in the review's side-by-side run."
  echo
  cat "$out"
} > "$out.md"
python3 "$ROOT/bench/update_section.py" footprint "$out.md"
