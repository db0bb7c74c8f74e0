#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write('import bisect\ndef binary_search(xs, x):\n    i = bisect.bisect_left(xs, x)\n    return i if i < len(xs) and xs[i] == x else -1\n')
PY
