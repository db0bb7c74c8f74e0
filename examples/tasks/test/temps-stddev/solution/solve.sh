#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('temps.csv')))
import statistics
ans = round(statistics.pstdev(float(r['temp']) for r in rows), 2)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
