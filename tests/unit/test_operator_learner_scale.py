"""The learner over several GPUs (torchrun in one Pod) and several nodes (a JobSet): the rendered manifests.

Built-in kinds are validated with kubernetes-validate; the JobSet against the JobSet CRD's schema (vendored in
tests/fixtures/crds, see its header), strictly (a field the CRD does not know is an error, not pruned), and its
Job template as a batch/v1 Job with kubernetes-validate.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from harnessrl.operator.plan.types import PlanError

from tests.unit.test_operator_manifests import K8S_VERSION, manifests

ROOT = Path(__file__).resolve().parents[2]
JOBSET_CRD = yaml.safe_load((ROOT / "tests" / "fixtures" / "crds" / "jobsets.jobset.x-k8s.io.yaml").read_text())


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural schema as JSON Schema that rejects unknown fields (the API server would prune them)."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


JOBSET_SCHEMA = strict(JOBSET_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def learner(**spec: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return manifests(learner={"gpus": 4, **spec})


def test_several_gpus_run_torchrun_in_one_pod() -> None:
    out = learner()
    job = out[("Job", "run-learner")]
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["harnessrl", "torchrun", "--nproc-per-node=4", "--standalone"]
    assert container["command"][4:] == ["--no-python", "harnessrl", "learner", "--config", "/etc/harnessrl/config.yaml"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert not any(kind == "JobSet" for kind, _ in out)


def test_one_gpu_runs_the_learner_itself() -> None:
    [container] = manifests(learner={"gpus": 1})[("Job", "run-learner")]["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "harnessrl"


def test_several_nodes_are_a_jobset_with_a_rendezvous_service() -> None:
    out = learner(nodes=3)
    assert ("Job", "run-learner") not in out
    jobset = out[("JobSet", "run-learner")]
    jsonschema.validate(jobset, JOBSET_SCHEMA)
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    spec = jobset["spec"]
    [rjob] = spec["replicatedJobs"]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x", "namespace": "team"}, "spec": rjob["template"]["spec"]}
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    assert rjob["replicas"] == 1
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert job["spec"]["completionMode"] == "Indexed"
    assert spec["failurePolicy"]["maxRestarts"] == 3  # the restart budget
    # torchrun's rendezvous at the first Pod's DNS name: <jobset>-<replicatedJob>-0-0.<subdomain>
    [container] = job["spec"]["template"]["spec"]["containers"]
    cmd = container["command"]
    subdomain = spec["network"]["subdomain"]
    assert spec["network"]["enableDNSHostnames"] is True
    assert "--nnodes=3" in cmd and "--nproc-per-node=4" in cmd and "--rdzv-backend=c10d" in cmd
    assert f"--rdzv-endpoint=run-learner-{rjob['name']}-0-0.{subdomain}:29400" in cmd
    headless = out[("Service", subdomain)]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert {"name": "rdzv", "containerPort": 29400, "protocol": "TCP"} in container["ports"]
    # Only rank 0 (the first Pod) serves the coordinator.
    assert out[("Service", "run-learner")]["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    for (kind, _), manifest in out.items():
        if kind != "JobSet":
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_the_jobset_schema_check_rejects_what_the_crd_does_not_know() -> None:
    jobset = copy.deepcopy(learner(nodes=2)[("JobSet", "run-learner")])
    jobset["spec"]["network"]["enableDnsHostnames"] = True  # wrong case: pruned by a real server, silently
    try:
        jsonschema.validate(jobset, JOBSET_SCHEMA)
    except jsonschema.ValidationError as exc:
        assert "enableDnsHostnames" in str(exc)
    else:
        raise AssertionError("an unknown JobSet field passed the schema check")


def test_a_suspended_multi_node_run_suspends_its_jobset() -> None:
    assert manifests(learner={"gpus": 2, "nodes": 2}, suspend=True)[("JobSet", "run-learner")]["spec"]["suspend"] is True


def test_nccl_sync_needs_an_unsharded_learner() -> None:
    full = {"model": {"base": {"hub": {"repo": "a/b"}}, "adapter": {"full": {}}},
            "engine": {"replicas": 1, "gpus": 4, "weightSync": "nccl"}}
    assert ("Job", "run-learner") in manifests(**full, learner={"gpus": 1})
    with pytest.raises(PlanError, match="weightSync nccl needs a learner on one GPU"):
        manifests(**full, learner={"gpus": 2})


def test_a_suspended_jobset_moves_to_its_admitted_nodes_and_keeps_everything_else() -> None:
    """Kueue's admission of a multi-node run: the live JobSet (suspended, with the server's defaults) gets the
    desired Pod template's nodeSelector and tolerations; the rest of each replicated Job stays as it is live."""
    from harnessrl.operator.control.apply import suspended_template_patch

    live = copy.deepcopy(manifests(learner={"gpus": 4, "nodes": 2}, suspend=True)[("JobSet", "run-learner")])
    live_pod = live["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    live_pod["spec"]["dnsPolicy"] = "ClusterFirst"  # a server default the operator never sends
    desired = manifests(learner={"gpus": 4, "nodes": 2},
                        pod={"nodeSelector": {"gpu": "h100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]})
    patch = suspended_template_patch(desired[("JobSet", "run-learner")], live)
    assert patch is not None
    pod = patch["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"} and pod["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert pod["spec"]["dnsPolicy"] == "ClusterFirst" and pod["spec"]["containers"] == live_pod["spec"]["containers"]
    assert patch["replicatedJobs"][0]["replicas"] == live["spec"]["replicatedJobs"][0]["replicas"]
    # Running (not suspended), the template is fixed: no patch.
    live["spec"]["suspend"] = False
    assert suspended_template_patch(desired[("JobSet", "run-learner")], live) is None


@pytest.mark.parametrize(("learner", "kind"), [({}, "Job"), ({"gpus": 4, "nodes": 2}, "JobSet")])
def test_a_running_learner_keeps_its_placement_and_says_it_waits_for_its_next_start(learner: dict[str, Any],
                                                                                   kind: str) -> None:
    """A running Job's Pod template is fixed: a placement edit (spec.pod) waits for the learner's next start, and
    the operator says so (status.py's SpecApplied); a suspended Job that has not started since moves at once."""
    from harnessrl.operator.control.apply import deferred_change

    live = copy.deepcopy(manifests(learner=learner)[(kind, "run-learner")])
    placed = manifests(learner=learner, pod={"nodeSelector": {"gpu": "h100"}})[(kind, "run-learner")]
    why = deferred_change(placed, live)
    assert why is not None and why.startswith(f"{kind} run-learner keeps its Pods' nodeSelector, tolerations while it runs")
    assert deferred_change(live, placed) is not None  # taking a placement away waits too
    assert deferred_change(live, copy.deepcopy(live)) is None
    live["spec"]["suspend"] = True
    assert deferred_change(placed, live) is None  # suspended and not started since: suspended_template_patch moves it


def test_a_multi_node_learners_own_checkpoint_claim_is_shared_between_nodes() -> None:
    # ReadWriteOnce binds the volume to one node: the other nodes' Pods would never start.
    one = learner(nodes=1, checkpointClaimName=None)[("PersistentVolumeClaim", "run-checkpoints")]
    several = learner(nodes=2, checkpointClaimName=None)[("PersistentVolumeClaim", "run-checkpoints")]
    assert one["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert several["spec"]["accessModes"] == ["ReadWriteMany"]
    kubernetes_validate.validate(several, K8S_VERSION, strict=True)
