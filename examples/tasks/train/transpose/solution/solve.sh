#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write('def transpose(m):\n    return [list(r) for r in zip(*m)]\n')
PY
