#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.reader(open('sales.csv')))
body = sorted(rows[1:], key=lambda r: (-int(r[4]), r[0]))
csv.writer(open('sorted.csv', 'w', newline='')).writerows([rows[0]] + body)
PY
