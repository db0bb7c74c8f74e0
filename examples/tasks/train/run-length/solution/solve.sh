#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write("import itertools\ndef rle(s):\n    return ''.join(f'{c}{len(list(g))}' for c, g in itertools.groupby(s))\n")
PY
