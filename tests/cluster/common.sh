# The cluster tiers' shell helpers (sourced by tests/cluster/lib.sh and tests/cluster_fleet/lib.sh).
# A tier may define fail_evidence, which fail calls to print what else explains a failure.

kc() { kubectl --request-timeout=30s "$@"; }
say() { echo "--- $*"; }
fail() {
  echo "FAIL: $*" >&2
  echo "--- pods:" >&2; kc get pods -A -o wide 2>&1 | tail -30 >&2 || true
  echo "--- recent events:" >&2; kc get events -A --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2 || true
  if declare -F fail_evidence >/dev/null; then fail_evidence >&2 || true; fi
  exit 1
}

# until_true SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds or SECONDS pass.
until_true() {
  local t="$1" what="$2"; shift 2
  local end=$((SECONDS + t))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || fail "after ${t}s: $what"
    sleep 0.5
  done
}

# leftovers DIR...: what a teardown left of DIRs: each process whose command line names one of
# them, and each of them that still exists ("" when nothing is left).
leftovers() {
  local pattern p d left=""
  pattern="($(IFS='|'; echo "$*"))/"
  for p in /proc/[0-9]*; do
    grep -qE "$pattern" <<< "$(tr '\0' ' ' 2>/dev/null < "$p/cmdline")" && left="$left process ${p#/proc/};"
  done
  for d in "$@"; do
    if [ -e "$d" ]; then left="$left $d;"; fi
  done
  echo "$left"
}
