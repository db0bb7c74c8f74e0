#!/usr/bin/env bash
# `make fresh-check`: the repository's committed HEAD tried on a fresh machine, as a newcomer would. A container
# from bare Debian bookworm with only the README's prerequisites (checks/fresh/Dockerfile) clones it and runs
# `make demo`, then the install steps of `make test` and a short subset of the tests (checks/fresh/inside.sh).
# It fails on any install step a developer's machine hides (a package installed by hand, a cache, a tool on PATH).
#
# What it takes from this machine is network setup only: the host's CA bundle (TLS to PyPI and npm may be
# intercepted here) and, where present, the local wheel directory that stands in for PyTorch's CPU index
# (LOCAL_WHEELS, /opt/wheels here; pip reads it through PIP_FIND_LINKS, as on this machine).
# --privileged: the container is a machine whose root can make the namespaces bubblewrap needs, as on a VM;
# --shm-size: a machine's /dev/shm (a container's is 64 MB; vLLM's engine wants 160 MB of it for the tiny model).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}
CACHE=.cache/fresh-check
LOCAL_WHEELS=${LOCAL_WHEELS:-/opt/wheels}
HOST_CA=${HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
IMAGE=localhost/harnessrl/fresh-machine:bookworm
FRESH_TESTS=${FRESH_TESTS:-tests/integration/test_local_run_inputs.py tests/unit/test_local_plan.py \
tests/unit/test_package_extras.py tests/unit/test_runner_sandbox_bwrap.py tests/integration/test_runner_sandbox_local.py \
tests/integration/test_viewer_browser.py}

mkdir -p "$CACHE"
BASES=local checks/images.sh bases
podman build --network host -f checks/fresh/Dockerfile -t "$IMAGE" . >"$CACHE/build.log" 2>&1 \
  || { tail -20 "$CACHE/build.log" >&2; exit 1; }
git bundle create "$CACHE/repo.bundle" HEAD 2>/dev/null
env_args=(-e "FRESH_TESTS=$FRESH_TESTS")
# pip's and npm's download caches persist between checks (FRESH_CACHE=0: none): a cache saves downloads, it does
# not install anything, so it hides no install step.
rm -rf "$CACHE/out" && mkdir -p "$CACHE/out"
mounts=(-v "$PWD/$CACHE/repo.bundle:/repo.bundle:ro" -v "$PWD/checks/fresh/inside.sh:/inside.sh:ro"
        -v "$PWD/$CACHE/out:/out")
if [ "${FRESH_CACHE:-1}" = 1 ]; then
  mkdir -p "$CACHE/pip" "$CACHE/npm"
  mounts+=(-v "$PWD/$CACHE/pip:/root/.cache/pip" -v "$PWD/$CACHE/npm:/root/.npm")
fi
if [ -f "$HOST_CA" ]; then
  mounts+=(-v "$(realpath "$HOST_CA"):/run/host-ca.crt:ro")
  env_args+=(-e PIP_CERT=/run/host-ca.crt -e NODE_EXTRA_CA_CERTS=/run/host-ca.crt -e npm_config_cafile=/run/host-ca.crt)
fi
if compgen -G "$LOCAL_WHEELS/torch-*.whl" >/dev/null; then
  mounts+=(-v "$(realpath "$LOCAL_WHEELS"):/opt/local-wheels:ro")
  env_args+=(-e PIP_FIND_LINKS=/opt/local-wheels)
fi
start=$(date +%s)
status=0
podman run --rm --privileged --shm-size=4g --network host "${mounts[@]}" "${env_args[@]}" "$IMAGE" bash /inside.sh \
  2>&1 | tee "$CACHE/run.log" || status=${PIPESTATUS[0]}
echo "fresh-check: exit status $status after $(( $(date +%s) - start )) s (log: $CACHE/run.log)"
exit "$status"
