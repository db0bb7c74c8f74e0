#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import json
ans = sum('sale' in i['tags'] for i in json.load(open('inventory.json')))
open('answer.txt', 'w').write(str(ans) + '\n')
PY
