# The differential tier's shell preamble (sourced by run_fixture.sh and the tests): cluster
# instance 3, and `missing`, which skips (77) for a missing prerequisite, or fails under CI=true.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export GPULET_CLUSTER_INSTANCE=3
missing() {
  if [ "${CI:-}" = true ]; then echo "differential: $1 (CI=true: failing, not skipping)" >&2; exit 1; fi
  echo "differential skipped: $1" >&2; exit 77
}
