#!/usr/bin/env bash
# make bench: builds (done by make), then runs every bench/<area>/run.sh. Each writes its own
# section of docs/benchmarks.md through bench/update_section.py, so areas never clobber each other.
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export BUILD ROOT
for area in "$ROOT"/bench/*/run.sh; do
  echo "== bench: $(basename "$(dirname "$area")")"
  bash "$area"
done
echo "figures written to docs/benchmarks.md"
