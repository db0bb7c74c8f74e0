#!/usr/bin/env bash
# Verifier (Harbor layout): solved iff the first non-space character of answer.txt is a vowel.
set -u
LOGS="${LOGS_DIR:-/logs}"
cd "${WORKSPACE:-/workspace}"
mkdir -p "$LOGS/verifier"
python3 - "$LOGS/verifier/reward.txt" <<'PY'
import pathlib, sys
answer = pathlib.Path("answer.txt")
text = answer.read_text(errors="replace").lstrip() if answer.exists() else ""
pathlib.Path(sys.argv[1]).write_text("1\n" if text[:1].lower() in set("aeiou") else "0\n")
PY
