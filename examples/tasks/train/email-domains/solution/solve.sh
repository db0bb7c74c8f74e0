#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
ans = len({l.strip().split('@')[1] for l in open('emails.txt') if l.strip()})
open('answer.txt', 'w').write(str(ans) + '\n')
PY
