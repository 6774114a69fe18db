#!/usr/bin/env bash
# MIG: plan computation for 8 GPUs × 7 MIG devices, and `mig apply` on the simulated driver
# (ReadMigState + ApplyPlan through dlopen). Google Benchmark, in process.
set -euo pipefail
json=$(mktemp)
out=$(mktemp)
trap 'rm -f "$json" "$out" "$out.md"' EXIT
"$BUILD/bin/bench_mig" --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_format=console
python3 "$ROOT/bench/gbench_table.py" "$json" > "$out"
cat "$out"
{ echo "## MIG partitioning (issue 4)"; echo
  echo "One call per repetition. Plan: ComputePlan alone (pure) for 8 A100-40GB GPUs × 7 MIG"
  echo "devices: from MIG off, from a mixed 3g+2g+1g+1g layout (keeps the two 1g), and a mixed"
  echo "target that needs the placement search. Apply: read state + plan + apply on the simulated"
  echo "driver (every create/destroy is one flock'd rewrite of control.json, as other processes"
  echo "must see it); 8x7 = MIG on + 56 GPU instances + 56 compute instances. RelWithDebInfo on a"
  echo "2-core machine shared with other builds, so p99 carries scheduling noise."; echo
  cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" mig "$out.md"
