#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('people.csv')))
import json
json.dump([{'name': r['name'], 'age': int(r['age']), 'city': r['city']} for r in rows], open('people.json', 'w'))
PY
