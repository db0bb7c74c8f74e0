#!/usr/bin/env bash
# `make cluster-check`: the quickstart's children, as the operator renders them, started as containers from the
# images `make images` built (checks/cluster.py), inside a network namespace made here: the podman network, every
# Pod's and Service's address exist only in it, and no traffic leaves it. Needs root (podman, unshare).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/images/containers.conf}
WORK=${CLUSTER_CHECK_WORK:-/tmp/harnessrl-cluster-check}
MODEL=${CLUSTER_CHECK_MODEL:-.cache/tiny-model-steerable}
[ -d "$MODEL" ] || .venv/bin/harnessrl tiny-model "$MODEL" --init-std 0.1
start=$(date +%s)
# unshare: a new network namespace (lo brought up), ended when its last process (every container's) exits; the
# timeout bounds the whole check, and cluster.py removes what it started, by name, before it returns.
status=0
timeout --kill-after=30 900 unshare --net -- bash -c \
  'ip link set lo up 2>/dev/null || true; exec .venv/bin/python -P checks/cluster.py "$@"' cluster-check \
  --work "$WORK" --claim "tiny-model=$MODEL" --claim quickstart-tasks=examples/quickstart/tasks "$@" || status=$?
echo "cluster-check: took $(( $(date +%s) - start )) s (Pod volumes left in $WORK)"
exit "$status"
