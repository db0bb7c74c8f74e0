#!/usr/bin/env bash
# Reference solution (Harbor's oracle): computes the answer from the workspace's data.
set -eu
cd "${WORKSPACE:-/workspace}"
python3 - <<'PY'
import ast
tree = ast.parse(open('module.py').read())
ans = sum(isinstance(n, ast.FunctionDef) for n in tree.body)
open('answer.txt', 'w').write(str(ans) + '\n')
PY
