#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
open('solution.py', 'w').write("def caesar(s, k):\n    out = ''\n    for c in s:\n        if c.isascii() and c.isalpha():\n            base = ord('A') if c.isupper() else ord('a')\n            c = chr(base + (ord(c) - base + k) % 26)\n        out += c\n    return out\n")
PY
