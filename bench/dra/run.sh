#!/usr/bin/env bash
# DRA kubelet plugin: NodePrepareResources/NodeUnprepareResources latency (1 and 8 GPUs) through
# real gRPC, with the tests' Preparer in process and with `gpulet dra` and its node preparer; RSS.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md" "$out.smaps" "$out.smaps.threads" "$out.rss"' EXIT
GPULET_BUILD_DIR="$BUILD" GPULET_BENCH_SMAPS="$out.smaps" "$BUILD/bin/bench_dra" "${RUNS:-500}" \
  2>/dev/null | tee "$out"
# The RSS moves by up to a MiB from one start to the next (which malloc arena the threads' work
# lands in, and how it interleaves): more starts of the product, 200 claims each, for its spread.
for _ in $(seq 2 "${RSS_STARTS:-6}"); do
  GPULET_BUILD_DIR="$BUILD" "$BUILD/bin/bench_dra" 100 2>/dev/null | grep '^`gpulet dra' >> "$out.rss"
done
{
  echo "## DRA kubelet plugin (issue 22)"
  echo
  echo "bench/dra/dra_bench.cc: the kubelet's DRA side (testing/kubelet/dra_harness.h) calls"
  echo "NodePrepareResources then NodeUnprepareResources over the plugin's Unix socket; each Prepare"
  echo "GETs the claim from the fake API server over HTTPS (k8s::Client keeps the connection between"
  echo "GETs) and writes the checkpoint once (temp + fsync + rename + directory fsync), each Unprepare"
  echo "writes it once. First with the tests' recording Preparer in process (the plugin's own cost),"
  echo "then the product, \`gpulet dra --simulate dgx-h100\`, as deployed: it publishes and watches the"
  echo "node's ResourceSlices (7 slices, 216 devices; the timing starts once they are there), and its"
  echo "node preparer writes a CDI spec and its per-claim record on tmpfs (/dev/shm), as the deployment"
  echo "keeps them (/var/run/cdi, /run/gpulet/dra); the checkpoint stays on disk (/tmp here,"
  echo "/var/lib/kubelet/plugins there)."
  echo "The two \"of which\" rows time a claim GET and one checkpoint write alone."
  echo
  cat "$out"
  echo
  python3 - "$out" "$out.rss" <<'PY'
import re, statistics, sys
rows = [l for f in sys.argv[1:] for l in open(f) if l.startswith("`gpulet dra")]
rss = [float(re.search(r"VmRSS ([0-9.]+)", l).group(1)) for l in rows]
anon = [float(re.search(r"anonymous ([0-9.]+)", l).group(1)) for l in rows]
print(f"RSS over {len(rss)} starts of `gpulet dra` (the run above, then {len(rss) - 1} of 200 "
      f"claims each): min {min(rss):.1f}, median {statistics.median(rss):.1f}, "
      f"max {max(rss):.1f} MiB (anonymous {min(anon):.1f}-{max(anon):.1f} MiB).")
PY
  echo
  echo "Largest resident mappings of \`gpulet dra\` at that point (MiB):"
  python3 - "$out.smaps" <<'PY'
import collections, re, sys
rss, cur = collections.Counter(), None
for line in open(sys.argv[1]):
    m = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$", line)
    if m:
        cur = (m.group(1).strip() or "[anon]").split("/")[-1]
    elif line.startswith("Rss:"):
        rss[cur] += int(line.split()[1])
print(", ".join(f"{k} {v / 1024:.1f}" for k, v in rss.most_common(12)) + ".")
PY
  echo
  echo "Targets: prepare p99 under 5 ms without MIG (the \`gpulet dra\` rows), RSS under 16 MiB."
  echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) when the run ended."
} > "$out.md"
python3 "$ROOT/bench/update_section.py" dra "$out.md"
