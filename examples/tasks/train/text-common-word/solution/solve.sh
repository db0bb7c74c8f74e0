#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
from collections import Counter
ans = Counter(open('text.txt').read().split()).most_common(1)[0][0]
open('answer.txt', 'w').write(str(ans) + '\n')
PY
