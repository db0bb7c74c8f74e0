#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
ans = sum(line.split()[1] == 'ERROR' for line in open('app.log'))
open('answer.txt', 'w').write(str(ans) + '\n')
PY
