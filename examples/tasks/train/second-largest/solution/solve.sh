#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write('def second_largest(xs):\n    d = sorted(set(xs))\n    return d[-2] if len(d) > 1 else None\n')
PY
