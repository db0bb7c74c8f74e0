#!/usr/bin/env bash
# Verifier (Harbor layout): solved iff the first non-space character of answer.txt is a vowel. The checker runs
# on an absolute interpreter in isolated mode ($PYTHON, -I) and reads answer.txt without following a link or
# opening a FIFO or device.
set -u
LOGS="${LOGS_DIR:-/logs}"
cd "${WORKSPACE:-/workspace}"
mkdir -p "$LOGS/verifier"
"${PYTHON:-python3}" -I - "$LOGS/verifier/reward.txt" <<'PY'
import os, stat, sys
try:
    fd = os.open("answer.txt", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        regular = stat.S_ISREG(os.fstat(fh.fileno()).st_mode)
        text = fh.read(4096).decode(errors="replace").lstrip() if regular else ""
except OSError:
    text = ""
with open(sys.argv[1], "w") as out:
    out.write("1\n" if text[:1].lower() in set("aeiou") else "0\n")
PY
