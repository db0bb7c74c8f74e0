"""The learner: a Job (it runs to the last step and then succeeds; a crash restarts it from its latest
checkpoint, at most `restartBudget` times), a Service for the coordinator, and its checkpoint volume. Pure.

More than one GPU: the Pod runs `harnessrl torchrun --nproc-per-node GPUS` (torchrun, FSDP2). More than one node: the Pods are one
Indexed Job inside a JobSet (kubernetes-sigs/jobset) whose headless Service gives each Pod a DNS name; torchrun's
c10d rendezvous listens on the first Pod's. Only rank 0 serves the coordinator, so its Service selects that Pod."""

from __future__ import annotations

from harnessrl.operator.kube.common import (
    CONFIG_DIR,
    READ_ONLY_ROOT,
    TEMPLATE_HASH,
    Manifest,
    Owner,
    component_metadata,
    config_hash,
    config_map,
    container_ports,
    env_list,
    http_probe,
    pod_template,
    rendered_config,
    resources,
    service,
    template_hash,
    token_secret,
    volumes_and_mounts,
    writable_scratch,
)
from harnessrl.operator.kube.storage import base_model, checkpoint_claim, checkpoint_claim_name, task_index
from harnessrl.operator.plan.placement import CLUSTER_PATHS, POD_IP_ENV
from harnessrl.operator.plan.types import Plan
from harnessrl.runtime.contracts.learner_exit import EXIT_FAILED

SHM_SIZE = "8Gi"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
JOBSET_GROUP_VERSION = "/apis/jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "learner"
RDZV_PORT = 29400
# The label the Job controller puts on each Pod of an Indexed Job (Kubernetes >= 1.28).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
LEARNER_ARGS = ["harnessrl", "learner", "--config", f"{CONFIG_DIR}/config.yaml"]
TORCHRUN = ["harnessrl", "torchrun"]  # runtime/learner/launch.py


def nodes_subdomain(plan: Plan) -> str:
    return f"{plan.learner.name}-nodes"


def command(plan: Plan) -> list[str]:
    """`harnessrl learner`, under torchrun when the learner has more than one GPU or node."""
    learner = plan.learner
    if learner.gpus <= 1 and learner.replicas <= 1:
        return list(LEARNER_ARGS)
    # torchrun through `harnessrl torchrun`, which exits 78 when the learner did (torchrun itself exits 1), so the
    # podFailurePolicy below fails the run at once.
    run = [*TORCHRUN, f"--nproc-per-node={max(learner.gpus, 1)}"]
    if learner.replicas > 1:
        # JobSet's Pod hostname: <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain>
        leader = f"{learner.name}-{REPLICATED_JOB}-0-0.{nodes_subdomain(plan)}"
        run += [f"--nnodes={learner.replicas}", "--rdzv-backend=c10d", f"--rdzv-endpoint={leader}:{RDZV_PORT}",
                f"--rdzv-id={plan.run}"]
    else:
        run += ["--standalone"]
    return [*run, "--no-python", *LEARNER_ARGS]


def manifests(plan: Plan, owner: Owner) -> list[Manifest]:
    learner = plan.learner
    volumes, mounts = volumes_and_mounts(learner)
    model_volumes, model_mounts, model_inits = base_model(plan)
    runner = plan.runners[0] if plan.runners else None
    index_volumes, index_mounts, index_inits = task_index(plan, runner)
    scratch_volumes, scratch_mounts, home = writable_scratch()
    volumes += [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim_name(plan)}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
        *scratch_volumes,
        *model_volumes,
        *index_volumes,
    ]
    mounts += [
        {"name": "checkpoints", "mountPath": CLUSTER_PATHS["checkpoints"]},
        {"name": "shm", "mountPath": "/dev/shm"},
        *scratch_mounts,
        *model_mounts,
        *index_mounts,
    ]
    container = {
        "name": "learner",
        "image": learner.image,
        "command": command(plan),
        # The Pod's own IP: vLLM binds the NCCL weight-transfer rendezvous to it (a Service's ClusterIP is not on
        # the Pod's interfaces).
        "env": [*env_list(home), {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": container_ports(learner),
        "resources": resources(learner),
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # It writes its checkpoints volume, caches under HOME, /tmp and /dev/shm (tests/integration/test_read_only_root.py).
        "securityContext": READ_ONLY_ROOT,
    }
    multi_node = learner.replicas > 1
    if multi_node:
        container["ports"] = [*container["ports"], {"name": "rdzv", "containerPort": RDZV_PORT, "protocol": "TCP"}]
    else:
        # Probes only here: in a JobSet, Pods other than the first serve no coordinator, so a probe would keep
        # them unready for ever (or kill them).
        container["readinessProbe"] = http_probe("/healthz", period=10, failures=3)
        # The event loop serves /healthz while steps and transfers run in threads: a learner that stops
        # answering for 5 minutes is wedged, and a restart resumes from its checkpoint. Loading the weights
        # and replaying the journal come first, so the liveness check waits for a first answer (up to 30 min).
        container["startupProbe"] = http_probe("/healthz", period=30, failures=60)
        container["livenessProbe"] = http_probe("/healthz", period=30, failures=10)
    spec = {
        "restartPolicy": "Never",
        "initContainers": [*model_inits, *index_inits],
        "containers": [container],
        "volumes": volumes,
        # Nothing in the learner talks to the API server: the operator reads its status over HTTP.
        "automountServiceAccountToken": False,
    }
    pod = pod_template(plan, learner, spec, config_digest=config_hash(rendered_config(learner)))
    meta = component_metadata(plan, owner, learner)
    meta["annotations"] = {TEMPLATE_HASH: template_hash(pod)}
    job_spec = {
        "backoffLimit": plan.restart_budget,
        "completions": learner.replicas,
        "parallelism": learner.replicas,
        # Never two learners on one checkpoint volume: a replacement starts once the failed Pod is gone.
        "podReplacementPolicy": "Failed",
        # The learner exits with EXIT_FAILED when no restart can help (runtime/contracts/learner_exit.py): the run
        # fails at once with the reason in its termination message, instead of spending the restart budget.
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "learner", "operator": "In",
                                                  "values": [EXIT_FAILED]}},
            # A Pod evicted by a node drain or preemption is replaced without spending the restart budget.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
        "template": pod,
    }
    if plan.spec.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = plan.spec.active_deadline_seconds
    claim = checkpoint_claim(plan, owner)
    coordinator = service(plan, owner, learner, learner.name)
    common = [config_map(plan, owner, learner), *([claim] if claim else [])]
    if not multi_node:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
               "spec": job_spec | {"suspend": plan.suspended}}
        return [*common, coordinator, job]
    coordinator["spec"]["selector"] = coordinator["spec"]["selector"] | {COMPLETION_INDEX: "0"}
    rendezvous = service(plan, owner, learner, nodes_subdomain(plan), headless=True, metrics=False,
                         publish_not_ready=True)
    rendezvous["spec"]["ports"] = [{"name": "rdzv", "port": RDZV_PORT, "targetPort": "rdzv", "protocol": "TCP"}]
    return [*common, coordinator, rendezvous, jobset(plan, meta, job_spec)]


def jobset(plan: Plan, meta: Manifest, job_spec: Manifest) -> Manifest:
    """One replicated Job of `nodes` indexed Pods; any Pod failing restarts them all (torchrun cannot lose a
    node), from the latest checkpoint, at most `restartBudget` times."""
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": meta,
        "spec": {
            "suspend": plan.suspended,
            "network": {"enableDNSHostnames": True, "subdomain": nodes_subdomain(plan), "publishNotReadyAddresses": True},
            # A Job failed by its podFailurePolicy (the learner's EXIT_FAILED) or past the run's deadline fails the
            # JobSet without a restart.
            "failurePolicy": {"maxRestarts": plan.restart_budget, "rules": [
                {"name": "learner-gave-up", "action": "FailJobSet",
                 "onJobFailureReasons": ["PodFailurePolicy", "DeadlineExceeded"]},
            ]},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            "replicatedJobs": [{
                "name": REPLICATED_JOB,
                "replicas": 1,
                "template": {"spec": job_spec | {"backoffLimit": 0, "completionMode": "Indexed"}},
            }],
        },
    }


def runner_secret(plan: Plan, owner: Owner, token: str) -> Manifest:
    """The runners' credential at the coordinator: generated once by the operator, read by the learner (which
    checks it) and the runners (which send it)."""
    return token_secret(plan, owner, plan.runner_token_secret, plan.learner.kind, token)
