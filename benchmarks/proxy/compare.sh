#!/usr/bin/env bash
# Before/after: the harnessrl package at git revision REV (proxy and engine stand-in), then the working tree's,
# under the same run.py levels, back to back. The load generator and measurements are the working tree's in both.
# usage: benchmarks/proxy/compare.sh REV OUT_DIR [run.py options, e.g. --levels 100@2,200@2 --turns 10]
# Writes OUT_DIR/before/results.md and OUT_DIR/after/results.md.
set -euo pipefail
rev=$1
out=$2
shift 2
repo=$(git rev-parse --show-toplevel)
old=$(mktemp -d)
trap 'rm -rf "$old"' EXIT
# The old package as an import overlay: harnessrl/ with runtime/ and operator/ mapped in, as pyproject.toml does.
git -C "$repo" archive "$rev" harnessrl runtime operator | tar -x -C "$old"
mkdir "$old/pkg"
cp -r "$old/harnessrl" "$old/pkg/"
ln -s "$old/runtime" "$old/pkg/harnessrl/runtime"
ln -s "$old/operator" "$old/pkg/harnessrl/operator"
cd "$repo"
common=(--targets baseline,harnessrl --keep-collapsed harnessrl "$@")
PYTHONPATH="$old/pkg" .venv/bin/python benchmarks/proxy/run.py "${common[@]}" --out-dir "$out/before"
.venv/bin/python benchmarks/proxy/run.py "${common[@]}" --out-dir "$out/after"
