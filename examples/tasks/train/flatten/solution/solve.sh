#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write('def flatten(xs):\n    out = []\n    for x in xs:\n        out += flatten(x) if isinstance(x, list) else [x]\n    return out\n')
PY
