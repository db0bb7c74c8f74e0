#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('scores.csv')))
ans = round(100 * sum(int(r['score']) >= 60 for r in rows) / len(rows), 1)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
