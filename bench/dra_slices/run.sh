#!/usr/bin/env bash
# DRA ResourceSlices: time from a device change (health, inventory) to the slice update landing.
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
"$BUILD/bin/bench_dra_slices" "${RUNS:-200}" | tee "$out"
{
  echo "## DRA ResourceSlices: device change to slice update (issue 22)"
  echo
  echo "\`bench/dra_slices/run.sh\` (\`bench_dra_slices\`): the slice publisher (src/dra/publisher.h)"
  echo "against the fake API server over HTTPS; from the change (HealthBoard::Update, or SetDevices)"
  echo "until every slice of the new generation has been written and answered. Every change bumps the"
  echo "pool generation, so all slices are rewritten (in parallel; each write opens its own"
  echo "connection, since k8s::Client keeps connections for GETs only: a write whose answer was lost"
  echo "must not be resent on a reused connection; the new connection resumes the last TLS session)."
  echo
  cat "$out"
  echo
  echo "The CPU column is the whole process; a perf profile of this benchmark spreads it over malloc,"
  echo "nlohmann::json copies (the fake API server copies each object several times per write and per"
  echo "watch event) and OpenSSL (one resumed handshake per write). Building the 216-device pool is itself a"
  echo "visible share (BuildSlices row)."
  echo "Machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) when the run ended."
} > "$out.md"
python3 "$ROOT/bench/update_section.py" dra-slices "$out.md"
