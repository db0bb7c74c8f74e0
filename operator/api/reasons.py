"""Condition types and the reasons the operator writes on them: part of the API (printer columns read
conditions by type; users, alerts and Argo CD health checks read reasons). An Event carries the reason of the
condition transition it announces. Each name is documented here once; the API reference lists them.
"""

from __future__ import annotations

from dataclasses import dataclass

from harnessrl.runtime.contracts import learner_exit as failure


@dataclass(frozen=True)
class Documented:
    name: str
    doc: str
    warning: bool = False  # announced as a Warning Event (trouble), not a Normal one (progress)


CONDITION_TYPES: dict[str, Documented] = {}
REASONS: dict[str, Documented] = {}


def _condition(name: str, doc: str) -> str:
    CONDITION_TYPES[name] = Documented(name, doc)
    return name


def _reason(name: str, doc: str, warning: bool = False) -> str:
    REASONS[name] = Documented(name, doc, warning)
    return name


# Condition types.
READY = _condition("Ready", "every component is up (TrainingRun) / every runner replica is ready (HarnessPool)")
ENGINE_READY = _condition("EngineReady", "the inference engine's replicas are ready")
PROXY_READY = _condition("ProxyReady", "the capture proxy's replicas are ready")
HARNESSES_READY = _condition("HarnessesReady", "the runners of every pool the run uses are ready")
TRAINING = _condition("Training", "the learner is taking steps")
COMPLETE = _condition("Complete", "the run reached spec.grpo.steps")
FAILED = _condition("Failed", "the run stopped for good (restart budget spent, bad spec discovered late, ...)")
SUSPENDED = _condition("Suspended", "spec.suspend is true and the run's Pods are gone")
SPEC_APPLIED = _condition("SpecApplied", "every change of the run's spec is in effect, not waiting for a restart")

# Reasons.
ALL_COMPONENTS_READY = _reason("AllComponentsReady", "engine, proxy and harness runners are ready")
ALL_REPLICAS_READY = _reason("AllReplicasReady", "every replica of the workload is ready")
REPLICAS_NOT_READY = _reason("ReplicasNotReady", "some replicas are not ready yet, for no known trouble")
CREATING = _reason("Creating", "the workload is being created")
SUSPENDED_REASON = _reason("Suspended", "the run is suspended, so this component is scaled to zero")
SUSPENDED_BY_USER = _reason("SuspendedByUser", "spec.suspend is true: Pods scaled to zero, checkpoints kept")
NOT_SUSPENDED = _reason("NotSuspended", "spec.suspend is false")
RUN_FINISHED = _reason("RunFinished", "the run has finished (complete or failed); its Pods are scaled to zero")
TRAINING_REASON = _reason("Training", "the learner reports its steps")
WAITING_FOR_LEARNER = _reason("WaitingForLearner", "the learner is not running yet")
TRAINING_COMPLETE = _reason("TrainingComplete", "the learner finished spec.grpo.steps steps")
TRAINING_NOT_FINISHED = _reason("TrainingNotFinished", "the learner has steps left")
NO_FAILURE = _reason("NoFailure", "nothing has failed for good")
SPEC_IN_EFFECT = _reason("SpecInEffect", "the spec's current generation is in effect")
APPLIES_AT_NEXT_START = _reason(
    "AppliesAtNextStart", "a change the running learner cannot take (its Pods' placement: nodeSelector, tolerations, "
    "affinity) applies when it next starts; suspend and resume the run to apply it now",
)
NOT_IN_USE = _reason("NotInUse", "no TrainingRun uses this HarnessPool")
IMAGE_PULL_BACK_OFF = _reason("ImagePullBackOff", "a container image cannot be pulled", warning=True)
INSUFFICIENT_GPU = _reason("InsufficientGPU", "a Pod cannot be scheduled for lack of GPUs", warning=True)
UNSCHEDULABLE = _reason("Unschedulable", "a Pod cannot be scheduled", warning=True)
CRASH_LOOP_BACK_OFF = _reason("CrashLoopBackOff", "a container keeps crashing", warning=True)
CONFIG_ERROR = _reason("ConfigError", "a container cannot be created from its configuration", warning=True)
HUB_EXPORT_FAILING = _reason("HubExportFailing", "training goes on but the last Hub export failed", warning=True)
EVAL_REGRESSED = _reason(
    "EvalRegressed", "training goes on but a pool's held-out pass@1 fell well below its best (beyond its 95% interval)",
    warning=True,
)
RESTART_BUDGET_EXHAUSTED = _reason(
    "RestartBudgetExhausted", "the learner failed more often than spec.learner.restartBudget allows", warning=True
)
LEARNER_FAILED = _reason("LearnerFailed", "the learner's Job failed", warning=True)
DEADLINE_EXCEEDED = _reason("DeadlineExceeded", "the learner ran longer than spec.activeDeadlineSeconds", warning=True)
HARNESS_POOL_NOT_FOUND = _reason("HarnessPoolNotFound", "a HarnessPool the run names does not exist", warning=True)
ENGINE_POOL_UNAVAILABLE = _reason(
    "EnginePoolUnavailable", "the EnginePool in spec.engine.pool does not exist, or cannot serve the run (another base "
    "model, a LoRA rank above its maxRank)", warning=True,
)
JOBSET_NOT_INSTALLED = _reason(
    "JobSetNotInstalled", "spec.learner.nodes > 1 needs the JobSet API (jobset.x-k8s.io), not installed", warning=True
)
CHECKPOINT_CLAIM_NOT_SHARED = _reason(
    "CheckpointClaimNotShared", "spec.learner.nodes > 1 and learner.checkpointClaimName names a claim that is not "
    "ReadWriteMany (its Pods on other nodes could not mount it)", warning=True,
)
KUEUE_NOT_INSTALLED = _reason(
    "KueueNotInstalled", "spec.queueName needs Kueue's Workload API (kueue.x-k8s.io/v1beta1), not installed", warning=True
)
TOO_MANY_POD_SETS = _reason(
    "TooManyPodSets", "a Kueue Workload holds at most 8 pod sets: the learner, engine, proxy and at most 5 pools",
    warning=True,
)
AWAITING_ADMISSION = _reason(
    "AwaitingAdmission", "the Kueue Workload of the run (or of its EnginePool, or the EnginePool's own) waits for quota; "
    "nothing that holds a GPU runs until Kueue admits it"
)
EVICTED_BY_KUEUE = _reason(
    "EvictedByKueue", "Kueue evicted the Workload of the run (or EnginePool) (preemption, deactivation): its Pods stop; "
    "a run keeps its checkpoints and resumes from the last one when Kueue admits it again", warning=True,
)
INVALID_HARNESS_POOL = _reason(
    "InvalidHarnessPool", "a HarnessPool the run uses fails the current model (also a condition on the pool)", warning=True
)
CHILD_REFUSED = _reason(
    "ChildRefused", "the API server refused a child built from the spec; the message names it and quotes the server",
    warning=True,
)
CHILD_CONFLICT = _reason(
    "ChildConflict", "an object with a child's name belongs to another owner (another controller, or an earlier "
    "run of the same name); the operator leaves it alone and retries with backoff. The message names both",
    warning=True,
)
CHILD_REPLACED = _reason(
    "ChildReplaced", "an Event: a workload an older operator made selected its Pods by other labels, in a field "
    "Kubernetes keeps fixed, so it was deleted and created again (its Pods restart)", warning=True,
)
CHECKPOINT_CLAIM_IN_USE = _reason(
    "CheckpointClaimInUse", "spec.learner.checkpointClaimName names a claim another live run holds (its own "
    "checkpoint claim or volume): the run would resume from that run's checkpoints and prune them", warning=True,
)
INVALID_SPEC = _reason("InvalidSpec", "the spec cannot be realised (an unsupported combination)", warning=True)
CONTEXT_TOO_LONG = _reason(
    "ContextTooLong", "spec.engine.maxModelLen exceeds the positions the model's config allows (vLLM would refuse "
    "to start)", warning=True,
)
LEARNER_MEMORY_TOO_SMALL = _reason(
    "LearnerMemoryTooSmall", "the learner's memory plan exceeds its GPUs (spec.learner.gpuMemoryGib)", warning=True
)
# The learner ends itself with these (runtime/contracts/learner_exit.py): no restart can help, the run fails at once.
WEIGHT_SYNC_UNSUPPORTED = _reason(
    failure.WEIGHT_SYNC_UNSUPPORTED, "the engine lacks vLLM's weight-transfer API, or CUDA is missing", warning=True
)
WEIGHT_SYNC_REJECTED = _reason(
    failure.WEIGHT_SYNC_REJECTED, "the engine refused a weight transfer (a version or config mismatch)", warning=True
)
WEIGHT_SYNC_FAILED = _reason(
    failure.WEIGHT_SYNC_FAILED, "publishing weights to the engine kept failing for the whole retry window", warning=True
)
WEIGHT_SYNC_HUNG = _reason(
    failure.WEIGHT_SYNC_HUNG, "a weight transfer did not finish in time: the communicator is unusable", warning=True
)
WEIGHT_SYNC_ADDRESS = _reason(
    failure.WEIGHT_SYNC_ADDRESS, "the learner's NCCL rendezvous address is not one of its own (vLLM binds rank 0 to it)",
    warning=True,
)
TRACKER_UNAVAILABLE = _reason(
    failure.TRACKER_UNAVAILABLE,
    "spec.tracking.reportTo lists a tracker whose package the learner image lacks, or whose Secret is empty",
    warning=True,
)

WARNING_REASONS = frozenset(r.name for r in REASONS.values() if r.warning)
