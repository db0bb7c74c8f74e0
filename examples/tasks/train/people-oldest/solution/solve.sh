#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('people.csv')))
ans = max(rows, key=lambda r: int(r['age']))['name']
open('answer.txt', 'w').write(str(ans) + '\n')
PY
