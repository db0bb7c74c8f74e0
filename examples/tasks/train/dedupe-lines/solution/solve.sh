#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
lines = open('lines.txt').read().splitlines()
open('unique.txt', 'w').write('\n'.join(dict.fromkeys(lines)) + '\n')
PY
