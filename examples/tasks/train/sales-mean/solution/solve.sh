#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('sales.csv')))
ans = round(sum(int(r['amount']) for r in rows) / len(rows), 2)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
