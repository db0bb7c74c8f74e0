#!/usr/bin/env bash
# Verifier (Harbor layout): the workspace is the cwd, tests/ is at $TESTS_DIR, the reward goes to
# $LOGS_DIR/verifier/reward.txt. Defaults are Harbor's container paths. The checker runs on an absolute
# interpreter in isolated mode ($PYTHON, -I: no workspace or user site on its import path); the candidate's
# code runs in a process of its own (check.py, through $RUN_CANDIDATE where the sandbox provides it).
set -u
LOGS="${LOGS_DIR:-/logs}"
TESTS="${TESTS_DIR:-/tests}"
cd "${WORKSPACE:-/workspace}"
mkdir -p "$LOGS/verifier"
"${PYTHON:-python3}" -I "$TESTS/check.py" "$TESTS/expected.json"
status=$?
# 0: correct, 1: wrong; anything else means the verifier itself broke, so no reward is written.
case $status in
  0) echo 1 > "$LOGS/verifier/reward.txt" ;;
  1) echo 0 > "$LOGS/verifier/reward.txt" ;;
  *) exit $status ;;
esac
