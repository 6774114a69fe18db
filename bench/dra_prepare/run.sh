#!/usr/bin/env bash
# DRA: Preparer::Prepare alone on the simulated driver and a fake driver root. Google Benchmark,
# in process.
set -euo pipefail
json=$(mktemp)
out=$(mktemp)
trap 'rm -f "$json" "$out" "$out.md"' EXIT
"$BUILD/bin/bench_dra_prepare" --benchmark_out="$json" --benchmark_out_format=json \
  --benchmark_format=console
python3 "$ROOT/bench/gbench_table.py" "$json" > "$out"
cat "$out"
{ echo "## DRA: Prepare on the node (issue 22 item 3)"; echo
  echo "Preparer::Prepare alone (no gRPC, no API server: bench/dra measures NodePrepareResources"
  echo "whole), one call per repetition, the Unprepare after it not timed, on the simulated"
  echo "dgx-h100 with a fake driver root (5 libraries with sonames, 3 binaries, device nodes);"
  echo "the CDI root and the state directory on tmpfs (/dev/shm), as /var/run/cdi and"
  echo "/run/gpulet/dra are on a node."
  echo "1_gpu / 8_gpus: the CDI spec with the driver's edits and the claim's record, each written"
  echo "atomically (fsync'd); memory_share: plus the limits directory, limits file and region;"
  echo "dynamic_mig: plus the layout lock, MIG mode on, GPU and compute instance created and read"
  echo "back through NVML and discovery (the simulator rewrites its flock'd control file per"
  echo "change). RelWithDebInfo on a 2-core machine shared with other builds, so p99 carries"
  echo "scheduling noise."; echo
  cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" dra_prepare "$out.md"
