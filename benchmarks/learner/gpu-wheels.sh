#!/usr/bin/env bash
# Fetches, here (PyPI reachable), the wheels that the lent GPU machine lacks for the learner's own step: its image
# has Python 3.12, torch, numpy, httpx, rich and yaml but not pydantic or TRL, and older transformers/peft. The
# versions are the project's pins (constraints.txt). They land in .whl/ (ignored by git), which the device run
# carries; gpu-check.sh installs them there. About 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
names=(pydantic pydantic_core annotated-types typing-inspection trl transformers peft accelerate tokenizers
       safetensors huggingface_hub hf-xet datasets dill multiprocess regex)
pins=()
for name in "${names[@]}"; do
  pin=$(grep -iE "^${name//[-_]/[-_]}==" constraints.txt) || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 "${platforms[@]}" --platform any -d .whl "${pins[@]}"
du -sh .whl
