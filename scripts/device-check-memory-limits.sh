#!/usr/bin/env bash
# Memory limits (issues 13, 24) against the real driver: builds libgpulet-cuda.so, the region tool,
# the probe (tests/memlimit/memlimit_probe.cc, linked against the real libcuda.so.1) and the nvcc
# runtime program (tests/memlimit/device/memlimit_runtime.cu), then runs them on GPU 0 under a
# limit and checks: cudaMalloc, cudaMallocAsync, cuMemCreate and arrays (sized by the driver) stop
# at the limit with an out-of-memory error; create → map → release keeps the memory charged until
# unmapped; a captured graph within the limit runs and one past it is refused; 4 threads freeing
# and allocating the same addresses lose no charge; cudaMemGetInfo and nvidia-smi show the limit
# as the total; the driver API reached by linking, dlsym and cuGetProcAddress_v2 is counted;
# kernels still run. Changes no GPU setting (no MIG mode, compute mode or clocks).
# Needs: an NVIDIA GPU and driver, nvcc (CUDA 12+), g++ 12+. Writes everything under $OUT (or a
# temporary directory). Exit status: 0 all checks passed, 1 a check failed, 2 not runnable here.
# Usage: scripts/device-check-memory-limits.sh [LIMIT_MIB]   (default 8192)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$(mktemp -d)}
LIMIT_MIB=${1:-8192}
LIMIT=$((LIMIT_MIB * 1024 * 1024))
mkdir -p "$OUT/bin" "$OUT/acct"
fails=0
check() {  # check NAME CONDITION-COMMAND...
  local name=$1
  shift
  if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
for tool in nvidia-smi nvcc g++; do
  command -v "$tool" > /dev/null || { echo "not runnable: $tool not found"; exit 2; }
done
nvidia-smi -L || { echo "not runnable: no GPU"; exit 2; }
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}

echo "== build"
set -e
g++ -std=c++20 -O2 -g -fPIC -shared -fvisibility=hidden -foptimize-sibling-calls -I"$ROOT/src" \
  "$ROOT/src/cudashim/shim.cc" "$ROOT/src/cudashim/region.cc" \
  -Wl,--version-script="$ROOT/src/cudashim/libgpulet-cuda.map" -Wl,-Bsymbolic -Wl,-z,now \
  -static-libstdc++ -static-libgcc -ldl -lpthread -o "$OUT/bin/libgpulet-cuda.so"
g++ -std=c++20 -O2 -I"$ROOT/src" "$ROOT/src/cudashim/region_tool.cc" "$ROOT/src/cudashim/region.cc" \
  -lpthread -o "$OUT/bin/gpulet-cuda-region"
g++ -std=c++20 -O2 -I"$ROOT/src" "$ROOT/tests/memlimit/memlimit_probe.cc" \
  -L"$CUDA_HOME/lib64/stubs" -lcuda -ldl -lpthread -o "$OUT/bin/memlimit_probe"
nvcc -O2 -o "$OUT/bin/memlimit_runtime" "$ROOT/tests/memlimit/device/memlimit_runtime.cu" -lcuda
set +e
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 | tr -d ' ')
export CUDA_VISIBLE_DEVICES=0 GPULET_CUDA_DIR="$OUT/acct"
PRELOAD="$OUT/bin/libgpulet-cuda.so"
# The limits file lives beside the library (read-only in a container), the region in GPULET_CUDA_DIR.
region() {
  "$OUT/bin/gpulet-cuda-region" create "$OUT/acct" "$UUID=$LIMIT" &&
    cp "$OUT/acct/gpulet-cuda.limits" "$OUT/bin/gpulet-cuda.limits"
}
under() { LD_PRELOAD="$PRELOAD" "$@"; }
value() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" | tail -1; }
echo "== GPU 0 $UUID, limit $LIMIT_MIB MiB"

for cmd in malloc async vmm array; do
  region
  out=$(under "$OUT/bin/memlimit_runtime" "$cmd" $((64 << 20)) 2>&1)
  echo "$out"
  admitted=$(echo "$out" | value admitted)
  err=$(echo "$out" | grep "^$cmd " | value err)
  "$OUT/bin/gpulet-cuda-region" show "$OUT/acct"
  check "$cmd stops at the limit" test "${admitted:-0}" -gt 0 -a "${admitted:-0}" -le "$LIMIT"
  check "$cmd fails with out-of-memory" \
    bash -c "[[ '$err' == cudaErrorMemoryAllocation || '$err' == CUDA_ERROR_OUT_OF_MEMORY ]]"
  check "$cmd leaves less than one chunk plus the context unused" \
    test $((LIMIT - ${admitted:-0})) -lt $(((64 << 20) + (2048 << 20)))
done

CONTEXT_ROOM=$((2048 << 20))  # a context and the runtime's own memory, at most
region
out=$(under "$OUT/bin/memlimit_runtime" vmm-mapped $((256 << 20)) 2>&1)
echo "$out"
admitted=$(echo "$out" | grep "^vmm-mapped admitted" | value admitted)
check "vmm create/map/release stops at the limit" test "${admitted:-0}" -gt 0 -a "${admitted:-0}" -le "$LIMIT"
check "vmm mapped memory stays charged after release (free near 0)" \
  test "$(echo "$out" | grep "^vmm-mapped admitted" | value free)" -lt $((256 << 20))
check "vmm memory uncharged once unmapped" \
  test "$(echo "$out" | value unmapped_free)" -gt $((LIMIT - CONTEXT_ROOM))

region
out=$(under "$OUT/bin/memlimit_runtime" graph $((256 << 20)) 2>&1)
echo "$out"
check "a graph within the limit runs" bash -c "[[ '$(echo "$out" | value small)' == cudaSuccess ]]"
check "a graph past the limit is refused" \
  bash -c "[[ '$(echo "$out" | value big)' == cudaErrorMemoryAllocation ]]"

region
out=$(under "$OUT/bin/memlimit_runtime" reuse $((1 << 20)) 2>&1)
echo "$out"
check "address reuse between threads loses no charge" \
  test "$(echo "$out" | value before)" -eq "$(echo "$out" | value after)"

region
out=$(under "$OUT/bin/memlimit_runtime" info 2>&1)
echo "$out"
check "cudaMemGetInfo total is the limit" test "$(echo "$out" | value total)" -eq "$LIMIT"
check "kernels run under the library" bash -c "[[ '$(echo "$out" | value kernel)' == cudaSuccess ]]"

smi_total=$(under nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | tr -d ' ')
echo "nvidia-smi memory.total under the library: $smi_total MiB"
check "nvidia-smi shows the limit" test "$smi_total" -eq "$LIMIT_MIB"

for via in link dlsym procaddr; do
  region
  out=$(under "$OUT/bin/memlimit_probe" --via "$via" init fill alloc $((16 << 20)) info owners 2>&1)
  echo "$out" | grep -E "^(init|fill|info|procaddr)"
  admitted=$(echo "$out" | grep "^fill" | value admitted)
  check "driver API via $via stops at the limit" test "${admitted:-0}" -gt 0 -a "${admitted:-0}" -le "$LIMIT"
  check "driver API via $via: out-of-memory" bash -c "[[ '$(echo "$out" | grep '^fill' | value last_rc)' == 2 ]]"
  check "driver API via $via: cuMemAlloc_v2 is wrapped" \
    bash -c "echo '$out' | grep -q 'cuMemAlloc_v2=libgpulet-cuda.so:cuMemAlloc_v2'"
  check "driver API via $via: cuGetExportTable untouched" \
    bash -c "echo '$out' | grep -q 'cuGetExportTable=libcuda.so'"
done

region
out=$(env -u GPULET_CUDA_DIR GPULET_CUDA_DIR="$OUT/missing" LD_PRELOAD="$PRELOAD" \
  "$OUT/bin/memlimit_runtime" malloc 2>&1)
echo "$out"
check "fails closed without a region" bash -c "echo '$out' | grep -q 'cannot enforce GPU memory limits'"

echo "== $fails failed check(s); files in $OUT"
[[ $fails -eq 0 ]]
