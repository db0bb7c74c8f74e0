"""Where a run's data lives in its Pods: base weights, the task set, the task index, checkpoints. Pure."""

from __future__ import annotations

from harnessrl.operator.api.common import RUN_UID_LABEL, VolumePath
from harnessrl.operator.api.trainingrun import BaseModelSource
from harnessrl.operator.kube.common import Manifest, Owner, env_list, metadata, secret_mounts
from harnessrl.operator.plan.placement import CLUSTER_PATHS, eval_task_ids_file, validation_task_ids_file
from harnessrl.operator.plan.secret_files import hub_token_env
from harnessrl.operator.plan.types import Component, ComponentKind, Plan

CHECKPOINT_SIZE = "50Gi"


def checkpoint_claim_name(plan: Plan) -> str:
    return plan.checkpoint_claim or f"{plan.run}-checkpoints"


def checkpoint_claim(plan: Plan, owner: Owner) -> Manifest | None:
    """The run's own checkpoint volume, unless the spec names one. It outlives suspension. With
    checkpointRetention Retain it has no ownerReference, so it outlives the run too: the labels name the run
    and its uid (which run it was, and that a later run of the same name must not take it over)."""
    if plan.checkpoint_claim is not None:
        return None
    meta = metadata(plan, owner, checkpoint_claim_name(plan), str(ComponentKind.LEARNER), **{RUN_UID_LABEL: owner.uid})
    if plan.spec.learner.checkpoint_retention == "Retain":
        del meta["ownerReferences"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {"accessModes": [checkpoint_access_mode(plan)], "resources": {"requests": {"storage": CHECKPOINT_SIZE}}},
    }


def checkpoint_access_mode(plan: Plan) -> str:
    """A learner on several nodes mounts its checkpoints on each (every rank reads the one it resumes from):
    ReadWriteOnce binds the volume to one node, so the other Pods could never start."""
    return "ReadWriteMany" if plan.learner.replicas > 1 else "ReadWriteOnce"


def unshared_claim(plan: Plan, claim: Manifest | None) -> str | None:
    """Why the user's checkpoint claim cannot serve this learner (None: it can, or it is not there yet)."""
    wanted = checkpoint_access_mode(plan)
    modes = ((claim or {}).get("spec") or {}).get("accessModes") or []
    if claim is None or wanted == "ReadWriteOnce" or wanted in modes:
        return None
    return (f"learner.nodes {plan.learner.replicas} mounts the checkpoints on every node, and PersistentVolumeClaim "
            f"{plan.checkpoint_claim} is {', '.join(modes) or 'without access modes'}: name a ReadWriteMany claim "
            "(a shared file system) in learner.checkpointClaimName, or set learner.nodes to 1")


def base_model(plan: Plan) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """(volumes, mounts, init containers) giving the learner the base weights at the base-model path.

    A PVC is mounted read-only; a Hub repository is downloaded into an emptyDir by an init container
    (the engine needs neither: vLLM reads a hub id itself).
    """
    path = CLUSTER_PATHS["base-model"]
    base = plan.spec.model.base
    if base.pvc is not None:
        return (*_pvc_base_model(base.pvc), [])
    assert base.hub is not None
    # A gated model's token: the learner mounts it (plan.hub_read_tokens), `hf download` reads HF_TOKEN_PATH.
    token = secret_mounts(plan.learner, CLUSTER_PATHS["base-model-token"])
    init = {
        "name": "base-model",
        "image": plan.learner.image,
        "command": ["hf", "download", base.hub.repo, "--revision", base.hub.revision, "--local-dir", path],
        "volumeMounts": [{"name": "base-model", "mountPath": path}, *token],
    }
    if token:
        init["env"] = env_list(hub_token_env(CLUSTER_PATHS["base-model-token"]))
    return [{"name": "base-model", "emptyDir": {}}], [{"name": "base-model", "mountPath": path}], [init]


def engine_model(base: BaseModelSource) -> tuple[list[Manifest], list[Manifest]]:
    """(volumes, mounts) of the engine: only a PVC base model needs one."""
    return _pvc_base_model(base.pvc) if base.pvc is not None else ([], [])


def _pvc_base_model(pvc: VolumePath) -> tuple[list[Manifest], list[Manifest]]:
    volume = {"name": "base-model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}}
    mount = {"name": "base-model", "mountPath": CLUSTER_PATHS["base-model"], "subPath": pvc.path, "readOnly": True}
    return [volume], [_drop_empty_subpath(mount)]


def task_set(plan: Plan, image: str) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """(volumes, mounts, init containers) putting the task set at the tasks path.

    A PVC is mounted read-only; an image's task directory is copied out by an init container running
    that image; a Hub dataset is fetched by the component itself (nothing to mount).
    """
    path = CLUSTER_PATHS["tasks"]
    tasks = plan.spec.tasks
    if tasks.pvc is not None:
        volume = {"name": "tasks", "persistentVolumeClaim": {"claimName": tasks.pvc.claim_name, "readOnly": True}}
        return [volume], [_drop_empty_subpath({"name": "tasks", "mountPath": path, "subPath": tasks.pvc.path, "readOnly": True})], []
    if tasks.image is not None:
        copy = {
            "name": "tasks",
            "image": tasks.image.image,
            "command": ["cp", "-R", f"{tasks.image.path.rstrip('/')}/.", path],
            "volumeMounts": [{"name": "tasks", "mountPath": path}],
        }
        return [{"name": "tasks", "emptyDir": {}}], [{"name": "tasks", "mountPath": path}], [copy]
    return [], [], []


# Lists the task ids of the trained split with the runner's own task loader, so learner and runners agree.
TASK_INDEX = """\
import os, pathlib
from pydantic import TypeAdapter
from harnessrl.runtime.contracts.runner_config import TaskSource
from harnessrl.runtime.harness.tasks import load_dir, source_dir, split_tasks
source = TypeAdapter(TaskSource).validate_json(os.environ["HARNESSRL_TASKS"])
tasks = load_dir(source_dir(source))
ids = sorted(split_tasks(tasks, os.environ["HARNESSRL_SPLIT"]))
limit = int(os.environ.get("HARNESSRL_LIMIT") or len(ids))
out = pathlib.Path(os.environ["HARNESSRL_TASK_IDS"])
out.write_text("".join(i + "\\n" for i in ids[:limit]))
print(f"{min(limit, len(ids))} tasks in split {os.environ['HARNESSRL_SPLIT']}")
if os.environ.get("HARNESSRL_EVAL_SPLIT"):  # the split evaluated during training (the learner applies its limit)
    held_out = sorted(split_tasks(tasks, os.environ["HARNESSRL_EVAL_SPLIT"]))
    pathlib.Path(os.environ["HARNESSRL_EVAL_TASK_IDS"]).write_text("".join(i + "\\n" for i in held_out))
    print(f"{len(held_out)} tasks in eval split {os.environ['HARNESSRL_EVAL_SPLIT']}")
if os.environ.get("HARNESSRL_VALIDATION_SPLIT"):  # picks the best checkpoint (the learner applies the limit)
    validation = sorted(split_tasks(tasks, os.environ["HARNESSRL_VALIDATION_SPLIT"]))
    pathlib.Path(os.environ["HARNESSRL_VALIDATION_TASK_IDS"]).write_text("".join(i + "\\n" for i in validation))
    print(f"{len(validation)} tasks in validation split {os.environ['HARNESSRL_VALIDATION_SPLIT']}")
"""


def task_index(plan: Plan, runner_source: Component | None) -> tuple[list[Manifest], list[Manifest], list[Manifest]]:
    """(volumes, mounts, init containers) writing the learner's task-id file from the task set."""
    ids_file = CLUSTER_PATHS["task-ids"]
    ids_dir = ids_file.rsplit("/", 1)[0]
    volumes, mounts, inits = task_set(plan, plan.learner.image)
    # The runners' task source is the same for every pool; without pools there is nothing to index.
    source = runner_source.config.tasks.model_dump_json() if runner_source is not None else "{}"  # type: ignore[union-attr]
    env = {
        "HARNESSRL_TASKS": source,
        "HARNESSRL_SPLIT": plan.spec.tasks.split,
        "HARNESSRL_TASK_IDS": ids_file,
        "HARNESSRL_LIMIT": str(plan.spec.tasks.limit or ""),
        "HARNESSRL_EVAL_SPLIT": plan.spec.eval.split if plan.spec.eval is not None else "",
        "HARNESSRL_EVAL_TASK_IDS": eval_task_ids_file(ids_file),
        "HARNESSRL_VALIDATION_SPLIT": (plan.spec.eval.validation_split or "") if plan.spec.eval is not None else "",
        "HARNESSRL_VALIDATION_TASK_IDS": validation_task_ids_file(ids_file),
    }
    index = {
        "name": "task-index",
        "image": plan.learner.image,
        "command": ["python", "-c", TASK_INDEX],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        # A gated Hub dataset's token, at the file the task source names.
        "volumeMounts": [*mounts, {"name": "task-ids", "mountPath": ids_dir},
                         *secret_mounts(plan.learner, CLUSTER_PATHS["tasks-token"])],
    }
    volumes = [*volumes, {"name": "task-ids", "emptyDir": {}}]
    return volumes, [{"name": "task-ids", "mountPath": ids_dir, "readOnly": True}], [*inits, index]


def _drop_empty_subpath(mount: Manifest) -> Manifest:
    return {k: v for k, v in mount.items() if not (k == "subPath" and not v)}

