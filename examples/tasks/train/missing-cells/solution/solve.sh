#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.reader(open('data.csv')))[1:]
ans = sum(c == '' for r in rows for c in r)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
