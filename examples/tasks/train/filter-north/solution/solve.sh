#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.reader(open('sales.csv')))
csv.writer(open('north.csv', 'w', newline='')).writerows([rows[0]] + [r for r in rows[1:] if r[2] == 'north'])
PY
