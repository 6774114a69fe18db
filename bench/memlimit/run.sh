#!/usr/bin/env bash
# Memory limits (issues 13, 24, 36): the library's added cost per allocate+free pair, per cuGetProcAddress
# lookup and per kernel launch, against the simulated driver, without and with libgpulet-cuda.so
# in the same run.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPULET_SIM_FIXTURE="$ROOT/testing/fixtures/hgx-h200.yaml"
export LD_LIBRARY_PATH="$BUILD/cuda_sim"
export GPULET_CUDA_DIR="$tmp"
bench="$BUILD/bin/bench_memlimit"
"$bench" --make-region "$tmp"
cp "$BUILD/lib/libgpulet-cuda.so" "$tmp/"  # it reads its limits from the file beside it
"$bench" "${BATCHES:-500}" > "$tmp/without"
LD_PRELOAD="$tmp/libgpulet-cuda.so" "$bench" "${BATCHES:-500}" > "$tmp/with"
# The differential run against the driver model (tests/memlimit/memlimit_model.cc), longer than
# make test's: charged == held after every step, nothing past the limit.
seed=${GPULET_MODEL_SEED:-$(( $(date +%s) ^ $$ ))}
steps=${MODEL_STEPS:-2000000}
"$bench" --make-region "$tmp" $((512 << 20))
echo "differential: seed=$seed steps=$steps" >&2
start=$(date +%s)
model=$(MODEL_LIMIT=$((512 << 20)) LD_PRELOAD="$tmp/libgpulet-cuda.so" \
  "$BUILD/bin/memlimit_model" "$tmp" diff "$seed" "$steps" | tail -1)
model_s=$(( $(date +%s) - start ))
echo "$model" >&2
{
  echo "## Memory limits (issues 13, 24, 36)"
  echo
  echo "Per call, simulated libcuda.so.1, ${BATCHES:-500} batches of 2000 calls (median and p99 of"
  echo "the batch means); \"added\" is with the library minus without. Load average at the run:"
  echo "$(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (p99 is the machine's noise, not the library's)."
  echo
  echo "| operation | without (ns) | with libgpulet-cuda.so (ns) | added, median (ns) | p99 without / with (ns) |"
  echo "|---|---|---|---|---|"
  paste -d' ' "$tmp/without" "$tmp/with" | while read -r name m0 p0 _ m1 p1; do
    printf '| %s | %s | %s | %.1f | %s / %s |\n' "$name" "$m0" "$m1" "$(echo "$m1 - $m0" | bc -l)" "$p0" "$p1"
  done
  echo
  echo "Differential run against the driver model (tests/memlimit/memlimit_model.cc, 512 MiB limit,"
  echo "charged == held and nothing past the limit after every step): \`$model\` in ${model_s} s."
} | tee "$tmp/section.md"
python3 "$ROOT/bench/update_section.py" memlimit "$tmp/section.md"
