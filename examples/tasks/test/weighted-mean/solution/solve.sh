#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('weighted.csv')))
w = [int(r['weight']) for r in rows]
ans = round(sum(int(r['score']) * x for r, x in zip(rows, w)) / sum(w), 2)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
