#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write('def chunk(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]\n')
PY
