#!/usr/bin/env bash
# Regenerates src/cli/gpulet.order, the order in which lld lays out gpulet's functions
# (src/cli/CMakeLists.txt, GPULET_ORDER_FUNCTIONS).
#
# Why: the kernel maps a binary's text 64 KiB around each page a process faults in, so code that
# runs scattered over the whole 8 MiB binary keeps nearly all of it resident. Listing the
# functions the long-running agents execute, first, packs them into a few hundred KiB.
#
# How: runs the DRA benchmark (`gpulet dra` preparing claims) and one round of the footprint
# benchmark (`gpulet plugin` and `gpulet node` under the kubelet harness) with every gpulet
# process under callgrind, and lists the functions of the gpulet binary that ran: those `gpulet
# dra` ran first (the ones the other agents share leading), then the other agents' own, each group
# in the order callgrind met them. Names are the mangled
# symbols; lld skips a name it no longer finds, so a stale list costs resident memory, never a
# broken build. Rerun it after large changes to the agents (it takes a few minutes):
#
#   scripts/gen-function-order.sh [BUILD_DIR]      # then rebuild: ninja -C build gpulet
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
command -v valgrind >/dev/null || { echo "gen-function-order: valgrind is needed (apt-get install valgrind)" >&2; exit 2; }
for f in "$BUILD/gpulet" "$BUILD/bin/bench_dra" "$BUILD/bin/gpulet-kubelet-harness"; do
  [ -x "$f" ] || { echo "gen-function-order: $f is missing: build first (ninja -C $BUILD gpulet bench_dra gpulet-kubelet-harness)" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A build directory whose gpulet runs the real one under callgrind; everything else is linked.
mkdir "$work/build"
for f in "$BUILD"/* "$BUILD"/.ninja_log; do [ -e "$f" ] && ln -s "$f" "$work/build/"; done
rm "$work/build/gpulet"
cat > "$work/build/gpulet" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --dump-instr=no --compress-strings=no --demangle=no \\
  --callgrind-out-file=$work/cg.%p "$BUILD/gpulet" "\$@"
EOF
chmod +x "$work/build/gpulet"
echo "gen-function-order: gpulet dra under callgrind (bench_dra)" >&2
GPULET_BUILD_DIR="$work/build" "$BUILD/bin/bench_dra" 20 >/dev/null 2>&1
echo "gen-function-order: gpulet plugin and gpulet node under callgrind (footprint)" >&2
python3 "$ROOT/bench/footprint/footprint_bench.py" "$work/build" 1 >/dev/null 2>&1 || true
python3 - "$BUILD/gpulet" "$ROOT/src/cli/gpulet.order" "$work"/cg.* <<'PY'
import collections, sys
binary, out, profiles = sys.argv[1], sys.argv[2], sys.argv[3:]
# Which agents ran each function. `gpulet dra` is the one the order serves first (its RSS target
# is the tightest); functions of the other agents follow, so each agent's code stays packed.
AGENTS = ["dra", "node", "plugin"]
ran_in = collections.defaultdict(set)
first = {}
for p in profiles:
    ob, agent = None, None
    for line in open(p, errors="replace"):
        if line.startswith("cmd:"):
            agent = next((w for w in line.split()[1:] if w in AGENTS), "other")
        elif line.startswith("ob="):
            ob = line[3:].strip()
        elif line.startswith("fn=") and ob is not None and ob.endswith("/gpulet"):
            name = line[3:].strip()
            if name.startswith("0x"):
                continue
            ran_in[name].add(agent)
            first.setdefault(name, len(first))
if not first:
    sys.exit("gen-function-order: no gpulet function in the profiles")
def key(name):
    agents = ran_in[name]
    # dra's functions first, those shared by the most agents leading; then the others' likewise.
    return ("dra" not in agents, -len(agents), sorted(agents), first[name])
names = sorted(first, key=key)
with open(out, "w") as f:
    f.write("\n".join(names) + "\n")
print(f"gen-function-order: {len(names)} functions from {len(profiles)} processes -> {out}",
      file=sys.stderr)
PY
