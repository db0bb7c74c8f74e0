#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('sales.csv')))
import json
t = {}
for r in rows: t[r['region']] = t.get(r['region'], 0) + int(r['amount'])
json.dump(t, open('totals.json', 'w'))
PY
