#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open('sales.csv')))
from collections import Counter
c = Counter()
for r in rows: c[r['region']] += int(r['amount'])
ans = c.most_common(1)[0][0]
open('answer.txt', 'w').write(str(ans) + '\n')
PY
