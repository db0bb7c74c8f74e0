#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import json
def s(v):
    if isinstance(v, (bool, str)): return 0
    if isinstance(v, (int, float)): return v
    return sum(s(x) for x in (v.values() if isinstance(v, dict) else v))
ans = s(json.load(open('nested.json')))
open('answer.txt', 'w').write(str(ans) + '\n')
PY
