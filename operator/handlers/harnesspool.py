"""Reconcile one HarnessPool's status: its runner replicas across the runs using it (for the scale
subresource and HPA), readiness, and rollout counters from those runs' learners. A pool's spec change
(e.g. `kubectl scale`) triggers the runs in its namespace, which resize their runner Deployments."""

from __future__ import annotations

from collections import Counter

from harnessrl.operator.api import reasons as R
from harnessrl.operator.api.common import API_VERSION
from harnessrl.operator.api.harnesspool import (
    KIND,
    HarnessPoolSpec,
    HarnessPoolStatus,
    PoolCapture,
    PoolRolloutCounts,
    PrefixBreaks,
)
from harnessrl.operator.handlers.context import Context
from harnessrl.operator.handlers.status import (
    pool_blocked_status,
    pool_status,
)
from harnessrl.operator.handlers.trainingrun import read_status, spec_problems, write_status
from harnessrl.operator.kube.common import COMPONENT, POOL
from harnessrl.operator.plan.types import ComponentKind
from harnessrl.runtime.contracts.harness_versions import pin
from pydantic import ValidationError


def reconcile(ctx: Context, namespace: str, name: str) -> None:
    kube = ctx.kube
    body = kube.get(API_VERSION, KIND, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    selector = {COMPONENT: str(ComponentKind.RUNNER), POOL: name}
    deployments = kube.list_objects("apps/v1", "Deployment", namespace, selector)
    pods = kube.list_objects("v1", "Pod", namespace, selector)
    counts = [p.pools[name] for (ns, _), p in list(ctx.progress.items()) if ns == namespace and name in p.pools]
    breaks: Counter[str] = Counter()
    for c in counts:
        breaks.update({cause.value: n for cause, n in c.prefix_breaks.items()})
    rollouts = PoolRolloutCounts(
        active=sum(c.active for c in counts),
        completed=sum(c.completed for c in counts),
        failed=sum(c.failed for c in counts),
        timed_out=sum(c.timed_out for c in counts),
        grader_failures=sum(c.grader_failures for c in counts),
        unknown_tool_calls=sum(c.unknown_tool_calls for c in counts),
        invalid_tool_calls=sum(c.invalid_tool_calls for c in counts),
        prefix_breaks=PrefixBreaks.model_validate(breaks),
        capture=PoolCapture(rollouts=sum(c.captured_rollouts for c in counts), sequences=sum(c.sequences for c in counts),
                            sampled_tokens=sum(c.sampled_tokens for c in counts)),
    )
    old = read_status(HarnessPoolStatus, body)
    generation = int(body["metadata"].get("generation") or 0)
    try:
        spec = HarnessPoolSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:  # stored before an upgrade: say so on the pool (its runs say it too)
        write_status(kube, KIND, body, old, pool_blocked_status(generation, old or HarnessPoolStatus(), R.INVALID_SPEC, spec_problems(exc, body.get("spec"))))
        return
    new = pool_status(generation, old, name, deployments, pods, rollouts)
    known = spec.harness.known
    if known is not None:  # an unpinned version is not a mystery: the pool says which CLI it gets
        new = new.model_copy(update={"harness_version": known.version or pin(known.name).version})
    write_status(kube, KIND, body, old, new)
