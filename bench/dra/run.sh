#!/usr/bin/env bash
# DRA kubelet plugin: NodePrepareResources/NodeUnprepareResources latency (1 and 8 GPUs) through
# real gRPC, with the tests' Preparer in process and with `gpulet dra` and its node preparer; RSS.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
GPULET_BUILD_DIR="$BUILD" "$BUILD/bin/bench_dra" "${RUNS:-500}" 2>/dev/null | tee "$out"
{
  echo "## DRA kubelet plugin (issue 22)"
  echo
  echo "bench/dra/dra_bench.cc: the kubelet's DRA side (testing/kubelet/dra_harness.h) calls"
  echo "NodePrepareResources then NodeUnprepareResources over the plugin's Unix socket; each Prepare"
  echo "GETs the claim from the fake API server over HTTPS and writes the checkpoint once (temp +"
  echo "fsync + rename + directory fsync), each Unprepare writes it once. First with the tests'"
  echo "recording Preparer in process (the plugin's own cost), then the product, \`gpulet dra"
  echo "--simulate dgx-h100\`, with the node preparer writing a CDI spec per claim. The two"
  echo "\"of which\" rows time a claim GET (k8s::Client opens a TLS connection per request) and one"
  echo "checkpoint write alone: on this machine they are the whole cost, and their p99 is the disk's"
  echo "and the CPU's under the other builds sharing it."
  echo
  cat "$out"
  echo
  echo "Against the issue's targets (prepare p99 under 5 ms without MIG, RSS under 16 MiB): see the"
  echo "\"of which\" rows: one TLS handshake per claim GET and the fsync'd checkpoint write are the"
  echo "cost; the RSS is the whole agent (NVML health watch, libcurl/OpenSSL, static gRPC)."
} > "$out.md"
python3 "$ROOT/bench/update_section.py" dra "$out.md"
