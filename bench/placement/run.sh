#!/usr/bin/env bash
# Placement policies: wall time of one 130 % replay of the openb default trace per policy (one
# thread, seeds 42.. one per run) and peak RSS (one process per policy). Needs the trace at
# ../shared/traces/alibaba-openb beside the repository (or TRACE_DIR); skipped without it.
set -euo pipefail
dir=${TRACE_DIR:-$ROOT/../shared/traces/alibaba-openb}
if [ ! -f "$dir/openb_node_list_gpu_node.csv" ]; then
  echo "placement: openb trace not found at $dir; skipped"
  exit 0
fi
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
{
  echo "| policy | pods arrived | median wall ms | worst wall ms | median CPU ms | peak RSS MiB | GPU allocation at 130 % (mean of runs) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for p in random dotprod gpuclustering gpupacking bestfit fgd fgd-bestfit; do
    "$BUILD/bin/bench_placement" "$dir" "$p" "${RUNS:-5}"
  done
} | tee "$out"
{
  echo "## Placement replay (issue 16)"
  echo
  echo "One \`gpulet replay\` run (openb default trace, 1,213 GPU nodes, arrivals up to 130 % of"
  echo "the 6,212 GPUs, every pod scored on every node) per policy, single thread, ${RUNS:-5} runs"
  echo "(seeds 42..) per policy; peak RSS of the whole process (trace loaded once)."
  echo "Build: $(sed -n "s/^CMAKE_BUILD_TYPE:STRING=//p" "$BUILD/CMakeCache.txt"); load average when run:"
  echo "$(cut -d' ' -f1-3 /proc/loadavg) (wall time includes waiting for a core on a busy machine; CPU"
  echo "time does not). Target: FGD under 1 s per run."
  echo
  cat "$out"
} > "$out.md"
python3 "$ROOT/bench/update_section.py" placement "$out.md"
