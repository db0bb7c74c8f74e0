#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import json
items = json.load(open('inventory.json'))
ans = round(sum(i['qty'] * i['price'] for i in items), 2)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
