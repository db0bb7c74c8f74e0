"""The learner: a Job (it runs to the last step and then succeeds; a crash restarts it from its latest
checkpoint, at most `restartBudget` times), a Service for the coordinator, and its checkpoint volume. Pure."""

from __future__ import annotations

from harnessrl.operator.kube.common import (
    CONFIG_DIR,
    RUN_AS,
    Manifest,
    Owner,
    component_metadata,
    config_hash,
    config_map,
    container_ports,
    http_probe,
    pod_template,
    rendered_config,
    resources,
    service,
    volumes_and_mounts,
)
from harnessrl.operator.kube.storage import base_model, checkpoint_claim, checkpoint_claim_name, task_index
from harnessrl.operator.plan import CLUSTER_PATHS, Plan
from harnessrl.runtime.learner.failure import EXIT_FAILED

# On a Job whose admission Kueue manages: the operator leaves `spec.suspend` to Kueue.
KUEUE_ADMITTED = "harnessrl.io/admitted-by-kueue"
SHM_SIZE = "8Gi"


def job_suspended(plan: Plan) -> bool:
    """Suspended when the run is; with a Kueue queue it starts suspended and Kueue admits it."""
    return plan.suspended or bool(plan.learner.pod.queue_name)


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    learner = plan.learner
    volumes, mounts = volumes_and_mounts(learner)
    model_volumes, model_mounts, model_inits = base_model(plan)
    runner = plan.runners[0] if plan.runners else None
    index_volumes, index_mounts, index_inits = task_index(plan, runner)
    volumes += [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim_name(plan)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        *model_volumes,
        *index_volumes,
    ]
    mounts += [
        {"name": "checkpoints", "mountPath": CLUSTER_PATHS["checkpoints"]},
        {"name": "shm", "mountPath": "/dev/shm"},
        *model_mounts,
        *index_mounts,
    ]
    container = {
        "name": "learner",
        "image": learner.image,
        "command": ["harnessrl", "learner", "--config", f"{CONFIG_DIR}/config.yaml"],
        "ports": container_ports(learner),
        "resources": resources(learner),
        "volumeMounts": mounts,
        "readinessProbe": http_probe("/healthz", period=10, failures=3),
        # The event loop serves /healthz while steps and transfers run in threads: a learner that stops
        # answering for 5 minutes is wedged, and a restart resumes from its checkpoint. Loading the weights
        # and replaying the journal come first, so the liveness check waits for a first answer (up to 30 min).
        "startupProbe": http_probe("/healthz", period=30, failures=60),
        "livenessProbe": http_probe("/healthz", period=30, failures=10),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spec = {
        "restartPolicy": "Never",
        "initContainers": [*model_inits, *index_inits],
        "containers": [container],
        "volumes": volumes,
        "securityContext": {"fsGroup": RUN_AS},
        # Nothing in the learner talks to the API server: the operator reads its status over HTTP.
        "automountServiceAccountToken": False,
    }
    pod = pod_template(plan, learner, spec, config_digest=config_hash(rendered_config(learner)))
    meta = component_metadata(plan, owner, learner)
    if learner.pod.queue_name and not plan.suspended:
        meta["annotations"] = {KUEUE_ADMITTED: "true"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "backoffLimit": plan.restart_budget,
            "completions": 1,
            "parallelism": 1,
            # Never two learners on one checkpoint volume: a replacement starts once the failed Pod is gone.
            "podReplacementPolicy": "Failed",
            # The learner exits with EXIT_FAILED when no restart can help (runtime/learner/failure.py): the run
            # fails at once with the reason in its termination message, instead of spending the restart budget.
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "learner", "operator": "In",
                                                      "values": [EXIT_FAILED]}},
            ]},
            "suspend": job_suspended(plan),
            "template": pod,
        },
    }
    claim = checkpoint_claim(plan, owner)
    return [
        config_map(plan, owner, learner),
        *([claim] if claim else []),
        service(plan, owner, learner, learner.name),
        job,
    ]
