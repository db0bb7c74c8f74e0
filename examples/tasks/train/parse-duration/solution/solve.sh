#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write("import re\ndef parse_duration(s):\n    unit = dict(h=3600, m=60, s=1)\n    return sum(int(n) * unit[u] for n, u in re.findall(r'(\\d+)([hms])', s))\n")
PY
