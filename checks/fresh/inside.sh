#!/usr/bin/env bash
# Runs inside the fresh machine (checks/fresh-machine.sh): clone, `make demo`, the install steps of `make test`,
# then a short subset of the tests. Each step is timed; the first failure ends the check.
set -euo pipefail
step() { printf '\n=== fresh-check: %s (%s)\n' "$1" "$(date -u +%T)"; STEP_START=$(date +%s); }
done_step() { printf '=== fresh-check: %s took %d s\n' "$1" $(( $(date +%s) - STEP_START )); }
# The container goes with the check: on a failure, the logs of whatever the demo started are shown here (their
# errors and last lines) and copied to /out (the host's .cache/fresh-check/out).
show_logs() {
  for log in "$HOME"/harnessrl/runs/*/logs/*.log; do
    [ -f "$log" ] || continue
    printf '\n--- %s: errors\n' "$log"
    grep -iE "error|exception|killed" "$log" | head -n 20 || true
    printf -- '--- %s: last 20 lines\n' "$log"
    tail -n 20 "$log"
  done
  if [ -d /out ]; then cp -r "$HOME"/harnessrl/runs /out/ 2>/dev/null || true; fi
}
trap 'status=$?; [ "$status" = 0 ] || show_logs' EXIT

step "prerequisites"
python3 --version && node --version && npm --version && git --version && make --version | sed -n 1p
done_step "prerequisites"

step "git clone"
git clone -q /repo.bundle harnessrl
cd harnessrl
git log --oneline -1
done_step "git clone"

step "make demo"
make demo
done_step "make demo"

step "the install steps of make test (test-deps lint typecheck)"
make test-deps lint typecheck
done_step "the install steps of make test (test-deps lint typecheck)"

step "a subset of the tests"
# shellcheck disable=SC2086  # FRESH_TESTS is a list of test paths
PATH="$PWD/.tools/bin:$PATH" .venv/bin/pytest -q -p no:cacheprovider -o addopts= $FRESH_TESTS
done_step "a subset of the tests"
echo "=== fresh-check: passed"
