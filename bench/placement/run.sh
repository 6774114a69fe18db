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
trap 'rm -f "$out" "$out".*' EXIT
{
  echo "| policy | pods arrived | median wall ms | worst wall ms | median CPU ms | peak RSS MiB | GPU allocation at 130 % (mean of runs) |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for p in random dotprod gpuclustering gpupacking bestfit fgd fgd-bestfit; do
    "$BUILD/bin/bench_placement" "$dir" "$p" "${RUNS:-5}"
  done
} | tee "$out"
{
  echo "## Placement replay, literal protocol (issue 16)"
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

# The FGD artifact's experiment under its own protocol (issue 25): 6 policies x 10 seeds of the
# default trace on 2 threads, compared point by point with the artifact's seed means
# (../shared/upstream/fgd-artifact, read there), and our fgd-bestfit under the same protocol.
art=${ARTIFACT_DIR:-$ROOT/../shared/upstream/fgd-artifact}/default-alloc_ratio_summary.csv
if [ ! -f "$art" ]; then
  echo "placement: the artifact's seed means not found at $art; reproduction skipped"
  exit 0
fi
"$BUILD/bin/bench_placement_reproduce" "$dir" default \
  random,dotprod,gpuclustering,gpupacking,bestfit,fgd 42 10 2 >"$out.csv" 2>"$out.err"
wall=$(sed -n 's/^wall_s=\([0-9.]*\).*/\1/p' "$out.err")
"$BUILD/bin/bench_placement_reproduce" "$dir" default fgd-bestfit 42 10 2 >"$out.fb.csv" \
  2>"$out.fb.err"
wall_fb=$(sed -n 's/^wall_s=\([0-9.]*\).*/\1/p' "$out.fb.err")
fb() { awk -F, -v p="$1" '$2 == p { printf "%.2f %% (sd %.2f)", $3, $4 }' "$out.fb.csv"; }
fgd() { awk -F, -v p="$1" '$1 == "fgd" && $2 == p { printf "%.2f %%", $3 }' "$out.csv"; }
bf() { awk -F, -v p="$1" '$1 == "bestfit" && $2 == p { printf "%.2f %%", $3 }' "$out.csv"; }
python3 "$ROOT/bench/placement/compare_artifact.py" "$out.csv" "$art" | tee "$out.table"
{
  echo "## Placement: the FGD artifact reproduced under its own protocol (issue 25)"
  echo
  echo "\`bench/placement/run.sh\`: \`bench_placement_reproduce\` (\`--protocol artifact\` of"
  echo "\`gpulet replay\`), openb default trace, 6 policies x 10 seeds (42..51) = 60 runs on 2 threads."
  echo "Load average when run: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  echo "| runs | threads | wall time, all runs | target |"
  echo "|---:|---:|---:|---|"
  echo "| 60 | 2 | ${wall} s | < 30 s |"
  echo
  echo "Allocation at 130 % arrived, seed mean: FGD $(fgd 130), BestFit $(bf 130); our"
  echo "fgd-bestfit under the same protocol $(fb 130) (10 runs, ${wall_fb} s on 2 threads)."
} >"$out.md"
python3 "$ROOT/bench/update_section.py" placement-artifact "$out.md"
{
  echo "Artifact / ours (ours − artifact), GPU allocation in % of the 6,212 GPUs, seed means over"
  echo "seeds 42..51, written by \`bench/placement/run.sh\` (\`make bench\`) with"
  echo "\`bench/placement/compare_artifact.py\`."
  echo
  cat "$out.table"
} >"$out.doc"
python3 "$ROOT/bench/update_section.py" placement-reproduction "$out.doc" "$ROOT/docs/placement.md"

# VARIANTS=1: all 17 pod lists the artifact ran, 7 policies x 10 seeds each (several minutes on
# 2 cores), into docs/placement.md's table of pod lists.
if [ "${VARIANTS:-0}" = 1 ]; then
  mkdir -p "$out.v"
  for v in default cpu050 cpu100 cpu200 cpu250 gpushare40 gpushare60 gpushare80 gpushare100 \
    gpuspec10 gpuspec20 gpuspec25 gpuspec33 multigpu20 multigpu30 multigpu40 multigpu50; do
    "$BUILD/bin/bench_placement_reproduce" "$dir" "$v" \
      random,dotprod,gpuclustering,gpupacking,bestfit,fgd,fgd-bestfit 42 10 2 >"$out.v/$v.csv" \
      2>/dev/null
  done
  {
    echo "GPU allocation at 130 % arrived, seed means over seeds 42..51, artifact protocol; written"
    echo "by \`VARIANTS=1 bench/placement/run.sh\` with \`bench/placement/variants_table.py\`."
    echo
    python3 "$ROOT/bench/placement/variants_table.py" "$out.v"
  } >"$out.vdoc"
  rm -rf "$out.v"
  python3 "$ROOT/bench/update_section.py" placement-variants "$out.vdoc" "$ROOT/docs/placement.md"
fi
