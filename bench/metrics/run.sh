#!/usr/bin/env bash
# Exporter: RSS, CPU, scrape latency and series count on simulated dgx-h100 and dgx-a100 (MIG).
set -euo pipefail
out=$(mktemp)
trap 'rm -f "$out" "$out.md"' EXIT
python3 "$ROOT/bench/metrics/exporter_bench.py" "$BUILD" "${SCRAPES:-2000}" | tee "$out"
{ echo "## Exporter (issue 5)"; echo; cat "$out"; } > "$out.md"
python3 "$ROOT/bench/update_section.py" exporter "$out.md"
