#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
ans = len(open('text.txt').read().split())
open('answer.txt', 'w').write(str(ans) + '\n')
PY
