#!/usr/bin/env bash
# Sharing: Allocate p50/p99 on 8 GPUs × 48 replicas (time-slicing and MPS), preferred allocation
# of replicas, plan computation for 8 GPUs × 7 MIG devices. Google Benchmark, in process.
set -euo pipefail
json=$(mktemp)
out=$(mktemp)
trap 'rm -f "$json" "$out" "$out.md"' EXIT
"$BUILD/bin/bench_sharing" --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_format=console
python3 "$ROOT/bench/gbench_table.py" "$json" > "$out"
cat "$out"
{ echo "## Sharing (issue 4)"; echo
  echo "One call per repetition, in process (no gRPC): what the plugin adds to a kubelet call."
  echo "8 GPUs × 48 replicas = 384 advertised IDs; the MIG plan is 8 GPUs × 7 × 1g.10gb, mixed,"
  echo "time-sliced ×4 (224 IDs). RelWithDebInfo; a 2-core machine shared with other builds, so p99"
  echo "carries scheduling noise."; echo
  cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" sharing "$out.md"
