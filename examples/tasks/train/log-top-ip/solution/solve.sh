#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
from collections import Counter
ans = Counter(l.split()[0] for l in open('access.log')).most_common(1)[0][0]
open('answer.txt', 'w').write(str(ans) + '\n')
PY
