"""The operator against the Kubernetes API emulator over HTTP, kopf running in KopfRunner's thread.

The emulator has no controllers, scheduler or kubelet: where a test needs a child to make progress it writes
the child's status (and creates its Pods) itself, as the StatefulSet/Job controllers and the kubelet would.
The learner's coordinator is replaced by a small HTTP server answering `GET /v1/status` with the learner's
own wire model (CoordinatorStatus): a real learner needs a model, an engine and runners, which these tests
are not about.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api.reasons import CHILD_REFUSED
from harnessrl.operator.control.apply import PLURALS
from harnessrl.operator.handlers import CACHED_CHILDREN, OperatorOptions, build_registry
from harnessrl.runtime.contracts.coordinator import Completion, CoordinatorStatus, LeaseRequest, PoolHarness
from harnessrl.runtime.contracts.learner_config import (
    EvalSchedule,
    GrpoConfig,
    HarnessWeight,
    RewardConfig,
    TaskSource,
)
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig
from harnessrl.runtime.harness.sandboxes.kubernetes import pod_manifest as sandbox_pod
from harnessrl.runtime.learner.coordinator import Coordinator
from harnessrl.runtime.learner.schedule import GroupPlanner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.kube import ADMIN_TOKEN, OPERATOR_TOKEN
from tests.kube_emulator import pod_security
from tests.kube_emulator.client import KubeApiError

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
CACHED = {PLURALS[kind] for kind in CACHED_CHILDREN}  # what the operator watches instead of listing
TR = ("harnessrl.io/v1alpha1", "TrainingRun")
HP = ("harnessrl.io/v1alpha1", "HarnessPool")
CHILD_KINDS = [
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
]

pytestmark = pytest.mark.timeout(60)
RETAINED = ("PersistentVolumeClaim", "run-a-checkpoints")
MINI = yaml.safe_load((ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml").read_text())
MINI_REPLICAS = MINI["spec"].get("replicas", 1)


class FakeLearnerStatus:
    """`GET /v1/status` of a learner's coordinator, answering what the test last set."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/v1/status" or outer.status is None:
                    self.send_error(503)
                    return
                body = json.dumps(outer.status).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def report(self, **fields: Any) -> None:
        # Zero values for whatever CoordinatorStatus requires, then the test's fields; validated by the
        # learner's own model. Progress fields it does not (yet) carry ride along as the learner may add them.
        zero = {bool: False, int: 0, float: 0.0, str: "policy"}
        base = {n: zero.get(f.annotation) for n, f in CoordinatorStatus.model_fields.items() if f.is_required()}
        known = {k: v for k, v in fields.items() if k in CoordinatorStatus.model_fields}
        extra = {k: v for k, v in fields.items() if k not in CoordinatorStatus.model_fields}
        self.status = CoordinatorStatus.model_validate(base | known).model_dump(mode="json") | extra


@pytest.fixture
def learner_status() -> Iterator[FakeLearnerStatus]:
    fake = FakeLearnerStatus()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        fake.thread.join(timeout=5)


@pytest.fixture
def cluster(kube_api: Any) -> Any:
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        kube_api.apply(crd)
    return kube_api


@contextmanager
def running_operator(kube_api: Any, learner_url: str, token: str = ADMIN_TOKEN,
                     namespaces: tuple[str, ...] = (NS,)) -> Iterator[None]:
    options = OperatorOptions(resync_seconds=0.3, learner_url_template=learner_url, request_timeout_s=5,
                              namespaces=list(namespaces))
    registry, _ = build_registry(options, kube_api.client(token))
    with kube_api.kopf_runner(registry, namespace=list(namespaces), token=token):
        yield


@pytest.fixture
def operator(cluster: Any, learner_status: FakeLearnerStatus) -> Iterator[Any]:
    with running_operator(cluster, learner_status.url):
        yield cluster


def children(kube_api: Any, run: str) -> set[tuple[str, str]]:
    found = set()
    for api_version, kind in CHILD_KINDS:
        for obj in kube_api.list_objects(api_version, kind, NS, label_selector=f"harnessrl.io/run={run}"):
            found.add((kind, obj["metadata"]["name"]))
    return found


def condition(kube_api: Any, run: str, type_: str) -> dict[str, Any] | None:
    obj = kube_api.get(*TR, run, namespace=NS)
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return None


def wait_condition(kube_api: Any, run: str, type_: str, status: str, reason: str | None = None,
                   timeout: float = 15) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = condition(kube_api, run, type_)
        if cond and cond["status"] == status and (reason is None or cond["reason"] == reason):
            return cond
        return None

    return kube_api.wait_for(check, timeout=timeout)


def apply_pools(kube_api: Any, *names: str) -> None:
    for name in names:
        kube_api.apply(ROOT / "examples" / "harnesspools" / f"{name}.yaml")


def reconciled_after_a_spec_change(kube_api: Any, run: str, timeout: float = 15) -> None:
    """Change the run's spec (a TTL far away: nothing it renders changes) and wait until the operator has written
    status for that generation: proof that it reconciled the run after everything done before this call."""
    generation = kube_api.patch(*TR, run, {"spec": {"ttlSecondsAfterFinished": 86400}}, namespace=NS)["metadata"]["generation"]
    kube_api.wait_for(lambda: ((kube_api.get(*TR, run, namespace=NS) or {}).get("status") or {})
                      .get("observedGeneration") == generation, timeout=timeout)


def small_run(name: str = "run-a", **spec: Any) -> dict[str, Any]:
    body = {
        "model": {"base": {"hub": {"repo": "Qwen/Qwen3-0.6B"}}},
        "tasks": {"pvc": {"claimName": "tasks", "path": "swe"}},
        "harnesses": [{"pool": "mini-swe-agent"}],
        "grpo": {"steps": 3},
        "engine": {"gpus": 1},
    } | spec
    return {"apiVersion": TR[0], "kind": TR[1], "metadata": {"name": name, "namespace": NS}, "spec": body}


def ready_workload(kube_api: Any, api_version: str, kind: str, name: str, replicas: int) -> None:
    """What the StatefulSet/Deployment controller reports once its Pods are ready."""
    kube_api.patch(api_version, kind, name, {"status": {"replicas": replicas, "readyReplicas": replicas,
                                                        "availableReplicas": replicas}},
                   namespace=NS, subresource="status")


def make_pod(kube_api: Any, run: str, component: str, name: str, status: dict[str, Any],
             pool: str | None = None, gpus: int = 0) -> None:
    """A Pod as its controller would create it, with the status the kubelet/scheduler would write."""
    labels = {"harnessrl.io/run": run, "harnessrl.io/component": component,
              "app.kubernetes.io/managed-by": "harnessrl-operator"} | ({"harnessrl.io/pool": pool} if pool else {})
    kube_api.apply({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NS, "labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "x"} | (
                        {"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}} if gpus else {})]}})
    kube_api.patch("v1", "Pod", name, {"status": status}, namespace=NS, subresource="status")


def test_example_trainingrun_creates_exactly_the_expected_children(operator: Any) -> None:
    operator.apply(ROOT / "tests" / "fixtures" / "crds" / "workloads.kueue.x-k8s.io.yaml")  # spec.queueName
    apply_pools(operator, "claude-code", "codex", "mini-swe-agent", "gemini-cli")
    run = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())["metadata"]["name"]
    operator.apply(ROOT / "examples" / "trainingrun.yaml")
    expected = {
        ("ConfigMap", f"{run}-engine-config"), ("Service", f"{run}-engine"), ("StatefulSet", f"{run}-engine"),
        ("ConfigMap", f"{run}-proxy-config"), ("Service", f"{run}-proxy-headless"), ("Service", f"{run}-proxy"),
        ("StatefulSet", f"{run}-proxy"), ("Secret", f"{run}-proxy-admin"), ("Secret", f"{run}-runner-token"),
        ("ConfigMap", f"{run}-learner-config"), ("Service", f"{run}-learner"), ("Job", f"{run}-learner"),
        ("NetworkPolicy", f"{run}-sandboxes"), ("NetworkPolicy", f"{run}-engine"), ("NetworkPolicy", f"{run}-proxy"),
        ("NetworkPolicy", f"{run}-learner"),
    }
    for pool in ("claude-code", "codex", "mini-swe-agent", "gemini-cli"):  # gemini-cli: evaluated under only
        name = f"{run}-{pool}-runner"
        expected |= {("ConfigMap", f"{name}-config"), ("ServiceAccount", name), ("Deployment", name),
                     ("NetworkPolicy", name)}
        pool_spec = yaml.safe_load((ROOT / "examples" / "harnesspools" / f"{pool}.yaml").read_text())["spec"]
        if "kubernetes" in pool_spec.get("sandbox", {"kubernetes": {}}):
            # Only a kubernetes-sandbox pool gets RBAC (to create, exec into and delete sandbox Pods).
            expected |= {("RoleBinding", name)}
    operator.wait_for(lambda: children(operator, run) == expected, timeout=15)
    obj = operator.get(*TR, run, namespace=NS)
    job = operator.get("batch/v1", "Job", f"{run}-learner", namespace=NS)
    assert job["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
    assert job["spec"]["backoffLimit"] == 3
    # queueName: Kueue admits the whole run as one Workload; until then nothing runs.
    workload = operator.get("kueue.x-k8s.io/v1beta1", "Workload", run, namespace=NS)
    assert workload["spec"]["queueName"] == "team-a" and len(workload["spec"]["podSets"]) == 3 + 4
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"] and job["spec"]["suspend"] is True
    engine = operator.get("apps/v1", "StatefulSet", f"{run}-engine", namespace=NS)
    assert engine["spec"]["replicas"] == 0
    assert next(s for s in workload["spec"]["podSets"] if s["name"] == "engine")["count"] == 2
    vllm = engine["spec"]["template"]["spec"]["containers"][0]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert engine["spec"]["template"]["spec"]["priorityClassName"] == "training"
    # The Hub token is a mounted Secret file, never a literal anywhere in the run's objects.
    learner_pod = job["spec"]["template"]["spec"]
    assert {"secretName": "hf-token", "items": [{"key": "token", "path": "token"}], "defaultMode": 0o440} in [
        v.get("secret") for v in learner_pod["volumes"]
    ]
    assert obj["metadata"].get("finalizers") in (None, [])
    # Runners get the chart's sandbox ClusterRole; the operator read its Secrets by name, never listed them.
    binding = operator.get("rbac.authorization.k8s.io/v1", "RoleBinding", f"{run}-codex-runner", namespace=NS)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "harnessrl-sandbox"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{run}-codex-runner", "namespace": NS}]
    secret_lists = [r.url for r in list(operator.emulator._requests) if r.url.path.endswith("/secrets")
                    and getattr(r.method, "value", r.method) == "GET"
                    and not r.headers.get("User-Agent", "").startswith("python-httpx")]  # not this test's own
    assert secret_lists == []


def test_conditions_go_pending_training_complete(operator: Any, learner_status: FakeLearnerStatus) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    wait_condition(operator, "run-a", "Training", "False", "WaitingForLearner")
    assert operator.get(*TR, "run-a", namespace=NS)["status"]["phase"] == "Pending"

    ready_workload(operator, "apps/v1", "StatefulSet", "run-a-engine", 1)
    ready_workload(operator, "apps/v1", "StatefulSet", "run-a-proxy", 1)
    ready_workload(operator, "apps/v1", "Deployment", "run-a-mini-swe-agent-runner", MINI_REPLICAS)
    wait_condition(operator, "run-a", "Ready", "True", "AllComponentsReady")

    learner_status.report(step=2, policy_version=2, rollouts_scored=16, mean_reward=0.5,
                          pass_at1={"mini-swe-agent": 0.25}, latest_checkpoint="/ckpt/step-2",
                          pools={"mini-swe-agent": {"active": 3, "completed": 16, "failed": 1, "timed_out": 0,
                                                    "unknown_tool_calls": 2,
                                                    "prefix_breaks": {"retry": 3, "history_changed": 1},
                                                    "captured_rollouts": 14, "sequences": 21,
                                                    "sampled_tokens": 900}})
    operator.patch("batch/v1", "Job", "run-a-learner", {"status": {"active": 1, "ready": 1}}, namespace=NS,
                   subresource="status")
    wait_condition(operator, "run-a", "Training", "True", "Training")
    operator.wait_for(lambda: operator.get(*TR, "run-a", namespace=NS)["status"].get("step") == 2)
    status = operator.get(*TR, "run-a", namespace=NS)["status"]
    assert status["phase"] == "Running" and status["policyVersion"] == 2
    assert status["rollouts"]["scored"] == 16 and status["meanReward"] == 0.5
    assert status["passAt1"] == {"mini-swe-agent": 0.25}
    pool = operator.wait_for(lambda: (p := operator.get(*HP, "mini-swe-agent", namespace=NS))
                             and p["status"]["rollouts"]["completed"] == 16 and p)
    assert pool["status"]["rollouts"] == {"active": 3, "completed": 16, "failed": 1, "timedOut": 0, "graderFailures": 0,
                                          "unknownToolCalls": 2, "invalidToolCalls": 0,
                                          "prefixBreaks": {"retry": 3, "replyChanged": 0, "historyChanged": 1},
                                          "capture": {"rollouts": 14, "sequences": 21, "sampledTokens": 900}}

    learner_status.report(step=3, policy_version=3, rollouts_scored=24, done=True, export_error="403 Forbidden")
    wait_condition(operator, "run-a", "Training", "True", "HubExportFailing")

    # The job controller's verdict once the learner exits 0 after its last step.
    operator.patch("batch/v1", "Job", "run-a-learner", {"status": {"active": 0, "ready": 0, "succeeded": 1,
                   "conditions": [{"type": "Complete", "status": "True"}]}}, namespace=NS, subresource="status")
    wait_condition(operator, "run-a", "Complete", "True", "TrainingComplete")
    status = operator.get(*TR, "run-a", namespace=NS)["status"]
    assert status["phase"] == "Succeeded" and status["step"] == 3 and status["completionTime"]
    # A finished run frees its GPUs: engine, proxy and runners go to zero.
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS)["spec"]["replicas"] == 0)
    operator.wait_for(lambda: {"Training", "TrainingComplete", "HubExportFailing"}
                      <= {e["reason"] for e in operator.list_objects("v1", "Event", NS)})


def eval_coordinator() -> Coordinator:
    """The learner's own coordinator with an evaluation schedule (mini-swe-agent trained on, qwen-code evaluated
    under only): the stand-in serves its real status as the learner would."""
    schedule = EvalSchedule(every_steps=1, at_start=False, tasks=TaskSource(ids=["e0", "e1"]),
                            pools=[PoolHarness(pool="mini-swe-agent", harness="mini-swe-agent"),
                                   PoolHarness(pool="qwen-code", harness="qwen-code")])
    planner = GroupPlanner(["t0"], [HarnessWeight(pool="mini-swe-agent", harness="mini-swe-agent")], 0, False)
    return Coordinator(planner, GrpoConfig(steps=3), RewardConfig(), 60.0, "policy", "http://proxy",
                       evaluation=schedule, eval_task_ids=schedule.task_ids())


def test_eval_pass_at_1_lands_in_status_and_eval_only_pools_get_runners(
    operator: Any, learner_status: FakeLearnerStatus
) -> None:
    apply_pools(operator, "mini-swe-agent", "qwen-code")
    operator.apply(small_run("run-e", eval={"everySteps": 1, "harnesses": ["mini-swe-agent", "qwen-code"]}))
    # The pool evaluated under but not trained on gets its runners, as a trained one does.
    runner = operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-e-qwen-code-runner", namespace=NS))
    assert runner["spec"]["replicas"] == 1
    coordinator = eval_coordinator()
    coordinator.state.mean_reward = 0.4
    coordinator.finish_step(1, "policy-v1", done=False)  # step 1 of 3: a round opens
    leases = {pool: coordinator.lease(LeaseRequest(runner_id="r", pool=pool, harness=pool, max=2), now=0)
              for pool in ("mini-swe-agent", "qwen-code")}

    def complete(pool: str, outcomes: list[str]) -> None:
        for lease, outcome in zip(leases[pool], outcomes, strict=True):
            coordinator.complete(Completion(rollout_id=lease.rollout_id, lease_id=lease.lease_id, outcome=outcome), [])

    complete("qwen-code", ["solved", "solved"])
    learner_status.status = coordinator.status().model_dump(mode="json")
    operator.patch("batch/v1", "Job", "run-e-learner", {"status": {"active": 1, "ready": 1}}, namespace=NS,
                   subresource="status")
    cond = operator.wait_for(lambda: (c := condition(operator, "run-e", "Training"))
                             and "evaluating" in c["message"] and c)
    assert cond["message"] == "step 1/3, policy v1, evaluating step 1 (2/4 rollouts)"
    complete("mini-swe-agent", ["solved", "wrong"])
    assert coordinator.close_eval(now=1) is not None
    learner_status.status = coordinator.status().model_dump(mode="json")
    status = operator.wait_for(lambda: (s := operator.get(*TR, "run-e", namespace=NS)["status"]).get("passAt1") and s)
    assert status["passAt1"] == {"mini-swe-agent": 0.5, "qwen-code": 1.0}
    assert status["meanReward"] == 0.4 and status["step"] == 1
    wait_condition(operator, "run-e", "Training", "True", "Training")
    assert condition(operator, "run-e", "Training")["message"] == "step 1/3, policy v1"  # type: ignore[index]


def waiting(container: str, reason: str, message: str = "") -> dict[str, Any]:
    """A Pod status as the kubelet writes it for a container that cannot start."""
    state = {"waiting": {"reason": reason} | ({"message": message} if message else {})}
    return {"containerStatuses": [{"name": container, "ready": False, "restartCount": 0, "image": "x", "imageID": "",
                                   "state": state}]}


def test_failing_children_surface_as_conditions_with_reasons(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS))
    troubles = [
        ("engine", waiting("vllm", "ImagePullBackOff", "Back-off pulling image"), "EngineReady", "ImagePullBackOff"),
        ("engine", {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                    "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]},
         "EngineReady", "InsufficientGPU"),
        ("proxy", waiting("proxy", "CrashLoopBackOff"), "ProxyReady", "CrashLoopBackOff"),
    ]
    for component, pod_status, condition_type, reason in troubles:
        if component == "proxy":  # the engine recovered: its Pod went away, its replicas are ready
            operator.delete("v1", "Pod", "run-a-engine-0", namespace=NS)
            ready_workload(operator, "apps/v1", "StatefulSet", "run-a-engine", 1)
        make_pod(operator, "run-a", component, f"run-a-{component}-0", pod_status)
        cond = wait_condition(operator, "run-a", condition_type, "False", reason)
        assert f"pod run-a-{component}-0" in cond["message"]
        wait_condition(operator, "run-a", "Ready", "False", reason)
        # Events are posted right after the status that they announce.
        warnings = operator.wait_for(lambda r=reason: [e for e in operator.list_objects("v1", "Event", NS)
                                                       if e["reason"] == r])
        assert {e["type"] for e in warnings} == {"Warning"}
        assert warnings[0]["involvedObject"]["kind"] == "TrainingRun" and warnings[0]["involvedObject"]["name"] == "run-a"
    wait_condition(operator, "run-a", "EngineReady", "True", "AllReplicasReady")


def test_deleted_or_drifted_child_is_restored(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", namespace=NS))
    first = operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)["metadata"]["uid"]
    operator.delete("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)
    restored = operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS))
    assert restored["metadata"]["uid"] != first
    operator.patch("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", {"spec": {"replicas": 7}}, namespace=NS)
    operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner",
                                           namespace=NS)["spec"]["replicas"] == MINI_REPLICAS)


def test_suspend_scales_to_zero_and_resume_continues(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS))
    operator.patch(*TR, "run-a", {"spec": {"suspend": True}}, namespace=NS)
    wait_condition(operator, "run-a", "Suspended", "True", "SuspendedByUser")

    def scaled(replicas: int, runners: int, suspended: bool) -> bool:
        get = operator.get
        return (get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS)["spec"]["replicas"] == replicas
                and get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)["spec"]["replicas"] == replicas
                and get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", namespace=NS)["spec"]["replicas"] == runners
                and get("batch/v1", "Job", "run-a-learner", namespace=NS)["spec"]["suspend"] is suspended)

    operator.wait_for(lambda: scaled(0, 0, True))
    # Checkpoints survive the suspension.
    assert operator.get("v1", "PersistentVolumeClaim", "run-a-checkpoints", namespace=NS) is not None
    assert operator.get(*TR, "run-a", namespace=NS)["status"]["phase"] == "Suspended"
    operator.patch(*TR, "run-a", {"spec": {"suspend": False}}, namespace=NS)
    wait_condition(operator, "run-a", "Suspended", "False", "NotSuspended")
    operator.wait_for(lambda: scaled(1, MINI_REPLICAS, False))


def test_ttl_deletes_finished_run_and_its_children(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run(ttlSecondsAfterFinished=1))
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS))
    operator.patch("batch/v1", "Job", "run-a-learner", {"status": {"failed": 4, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}}, namespace=NS, subresource="status")
    cond = wait_condition(operator, "run-a", "Failed", "True", "RestartBudgetExhausted")
    assert "restart budget 3" in cond["message"]
    operator.wait_for(lambda: operator.get(*TR, "run-a", namespace=NS) is None, timeout=15)
    assert children(operator, "run-a") == {RETAINED}  # checkpointRetention Retain (the default)


def test_terminal_run_stays_terminal(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS))
    operator.patch("batch/v1", "Job", "run-a-learner", {"status": {"succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True"}]}}, namespace=NS, subresource="status")
    wait_condition(operator, "run-a", "Complete", "True")
    operator.delete("batch/v1", "Job", "run-a-learner", namespace=NS)
    operator.delete("apps/v1", "StatefulSet", "run-a-engine", namespace=NS)
    reconciled_after_a_spec_change(operator, "run-a")
    assert operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS) is None
    assert condition(operator, "run-a", "Complete")["status"] == "True"


def test_invalid_spec_is_rejected(cluster: Any) -> None:
    for path in sorted((ROOT / "examples" / "invalid").glob("*.yaml")):
        if "# expect-status:" in path.read_text():
            continue  # unknown fields (refused only under fieldValidation=Strict) and undecodable bodies
        with pytest.raises(KubeApiError) as err:
            cluster.apply(path)
        assert err.value.status == 422, path.name


def test_missing_pool_is_reported_then_picked_up(operator: Any) -> None:
    operator.apply(small_run())
    wait_condition(operator, "run-a", "Ready", "False", "HarnessPoolNotFound")
    apply_pools(operator, "mini-swe-agent")
    operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", namespace=NS))


def test_a_multi_node_learner_waits_for_the_jobset_crd_then_runs_as_a_jobset(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run(learner={"gpus": 2, "nodes": 2}))
    cond = wait_condition(operator, "run-a", "Ready", "False", "JobSetNotInstalled")
    assert "jobset.x-k8s.io/v1alpha2" in cond["message"]
    assert operator.get("batch/v1", "Job", "run-a-learner", namespace=NS) is None
    # The JobSet CRD as vendored for tests (tests/fixtures/crds): the emulator validates JobSets against it.
    operator.apply(ROOT / "tests" / "fixtures" / "crds" / "jobsets.jobset.x-k8s.io.yaml")
    jobset = operator.wait_for(lambda: operator.get("jobset.x-k8s.io/v1alpha2", "JobSet", "run-a-learner", namespace=NS))
    assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 2
    assert operator.get("v1", "Service", "run-a-learner-nodes", namespace=NS)["spec"]["clusterIP"] == "None"
    assert operator.get("batch/v1", "Job", "run-a-learner", namespace=NS) is None
    wait_condition(operator, "run-a", "Training", "False", "WaitingForLearner")
    # The JobSet controller's verdict once every node's learner exits 0, read as the run's success.
    operator.patch("jobset.x-k8s.io/v1alpha2", "JobSet", "run-a-learner",
                   {"status": {"conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                                               "message": "jobset completed", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
                   namespace=NS, subresource="status")
    wait_condition(operator, "run-a", "Complete", "True", "TrainingComplete")


def test_a_multi_node_learner_on_a_claim_one_node_can_mount_is_refused_with_a_condition(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(ROOT / "tests" / "fixtures" / "crds" / "jobsets.jobset.x-k8s.io.yaml")

    def claim(name: str, mode: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NS},
                "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "10Gi"}}}}

    operator.apply(claim("ckpt-rwo", "ReadWriteOnce"))
    operator.apply(small_run(learner={"gpus": 2, "nodes": 2, "checkpointClaimName": "ckpt-rwo"}))
    cond = wait_condition(operator, "run-a", "Ready", "False", "CheckpointClaimNotShared")
    assert "PersistentVolumeClaim ckpt-rwo is ReadWriteOnce" in cond["message"] and "ReadWriteMany" in cond["message"]
    assert operator.get("jobset.x-k8s.io/v1alpha2", "JobSet", "run-a-learner", namespace=NS) is None
    # A shared claim: the learner starts on it.
    operator.apply(claim("ckpt-rwx", "ReadWriteMany"))
    operator.patch(*TR, "run-a", {"spec": {"learner": {"checkpointClaimName": "ckpt-rwx"}}}, namespace=NS)
    operator.wait_for(lambda: operator.get("jobset.x-k8s.io/v1alpha2", "JobSet", "run-a-learner", namespace=NS))


def test_scaling_a_pool_resizes_its_runners(operator: Any) -> None:
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner", namespace=NS))
    operator.patch(*HP, "mini-swe-agent", {"spec": {"replicas": 3}}, namespace=NS, subresource="scale")
    operator.wait_for(lambda: operator.get("apps/v1", "Deployment", "run-a-mini-swe-agent-runner",
                                           namespace=NS)["spec"]["replicas"] == 3)
    ready_workload(operator, "apps/v1", "Deployment", "run-a-mini-swe-agent-runner", 3)
    pool = operator.wait_for(lambda: (p := operator.get(*HP, "mini-swe-agent", namespace=NS))
                             and (p.get("status") or {}).get("readyReplicas") == 3 and p)
    assert pool["status"]["selector"] == "harnessrl.io/component=runner,harnessrl.io/pool=mini-swe-agent"
    assert pool["status"]["phase"] == "Ready"
    scale = operator.get(*HP, "mini-swe-agent", namespace=NS)
    assert scale["spec"]["replicas"] == 3


def test_runs_sharing_a_pool_split_its_replicas_so_scale_and_hpa_count_the_pool(operator: Any) -> None:
    """A pool's replicas are its runners across the runs using it: two runs get 2 + 1 of 3, a scale to 5 gives
    3 + 2, and the pool's status (the scale subresource an HPA reads) counts 5; a suspended run gives its share
    back."""
    apply_pools(operator, "mini-swe-agent")
    operator.patch(*HP, "mini-swe-agent", {"spec": {"replicas": 3}}, namespace=NS, subresource="scale")
    operator.apply(small_run("run-a"))
    operator.apply(small_run("run-b"))

    def runners() -> dict[str, int]:
        found = {}
        for run in ("run-a", "run-b"):
            d = operator.get("apps/v1", "Deployment", f"{run}-mini-swe-agent-runner", namespace=NS)
            found[run] = d["spec"]["replicas"] if d else None
        return found

    operator.wait_for(lambda: runners() == {"run-a": 2, "run-b": 1}, timeout=15)
    operator.patch(*HP, "mini-swe-agent", {"spec": {"replicas": 5}}, namespace=NS, subresource="scale")
    operator.wait_for(lambda: runners() == {"run-a": 3, "run-b": 2}, timeout=15)
    ready_workload(operator, "apps/v1", "Deployment", "run-a-mini-swe-agent-runner", 3)
    ready_workload(operator, "apps/v1", "Deployment", "run-b-mini-swe-agent-runner", 2)
    operator.wait_for(lambda: (operator.get(*HP, "mini-swe-agent", namespace=NS).get("status") or {}).get("replicas") == 5,
                      timeout=15)
    operator.patch(*TR, "run-b", {"spec": {"suspend": True}}, namespace=NS)
    operator.wait_for(lambda: runners() == {"run-a": 5, "run-b": 0}, timeout=15)


def test_a_learner_config_edit_restarts_the_learner_and_says_so(operator: Any) -> None:
    """A Job cannot take a new Pod template: an edit that changes the learner's config replaces its Job (the
    learner resumes from its latest checkpoint), with a ChildReplaced Event; an edit that changes nothing the
    learner reads keeps it running."""
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    first = operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS), timeout=15)
    reconciled_after_a_spec_change(operator, "run-a")  # a TTL: nothing the learner reads
    assert operator.get("batch/v1", "Job", "run-a-learner", namespace=NS)["metadata"]["uid"] == first["metadata"]["uid"]

    operator.patch(*TR, "run-a", {"spec": {"grpo": {"steps": 30}}}, namespace=NS)
    second = operator.wait_for(lambda: (j := operator.get("batch/v1", "Job", "run-a-learner", namespace=NS))
                               and j["metadata"]["uid"] != first["metadata"]["uid"] and j, timeout=15)
    config = operator.get("v1", "ConfigMap", "run-a-learner-config", namespace=NS)["data"]["config.yaml"]
    assert yaml.safe_load(config)["grpo"]["steps"] == 30
    assert second["spec"]["template"]["metadata"]["annotations"] != first["spec"]["template"]["metadata"]["annotations"]
    event = operator.wait_for(lambda: next((e for e in operator.list_objects("v1", "Event", NS)
                                            if e["reason"] == "ChildReplaced" and "Job run-a-learner" in e["message"]), None))
    assert "restarts from its latest checkpoint" in event["message"]
    reconciled_after_a_spec_change(operator, "run-a")
    assert operator.get("batch/v1", "Job", "run-a-learner", namespace=NS)["metadata"]["uid"] == second["metadata"]["uid"]


def test_a_placement_edit_moves_the_workloads_now_and_the_running_learner_at_its_next_start(operator: Any) -> None:
    """spec.pod's placement reaches the engine, proxy and runners at once (they roll); a running learner's Job
    cannot take it, and SpecApplied says so until the learner next starts (here: suspend, then resume)."""
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS), timeout=15)
    wait_condition(operator, "run-a", "SpecApplied", "True", "SpecInEffect")

    operator.patch(*TR, "run-a", {"spec": {"pod": {"nodeSelector": {"pool": "b"}}}}, namespace=NS)
    waiting = wait_condition(operator, "run-a", "SpecApplied", "False", "AppliesAtNextStart")
    assert waiting["message"].startswith("Job run-a-learner keeps its Pods' nodeSelector while it runs")
    proxy = operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)
    assert proxy["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "b"
    job = operator.get("batch/v1", "Job", "run-a-learner", namespace=NS)
    assert "pool" not in (job["spec"]["template"]["spec"].get("nodeSelector") or {})
    event = operator.wait_for(lambda: next((e for e in operator.list_objects("v1", "Event", NS)
                                            if e["reason"] == "AppliesAtNextStart"), None))
    assert event["type"] == "Normal" and "suspend and resume" in event["message"]

    # Suspended, the Job (which never started here: no Job controller) takes the placement; resumed, it runs there.
    operator.patch(*TR, "run-a", {"spec": {"suspend": True}}, namespace=NS)
    operator.wait_for(lambda: (operator.get("batch/v1", "Job", "run-a-learner", namespace=NS)["spec"]["template"]["spec"]
                               .get("nodeSelector") or {}).get("pool") == "b", timeout=15)
    wait_condition(operator, "run-a", "SpecApplied", "True", "SpecInEffect")
    operator.patch(*TR, "run-a", {"spec": {"suspend": False}}, namespace=NS)
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS)["spec"]["suspend"] is False)
    assert condition(operator, "run-a", "SpecApplied")["status"] == "True"


def chart_rbac(without: Callable[[dict[str, Any]], bool] = lambda rule: False, values: str = "default") -> list[dict[str, Any]]:
    """The chart's ServiceAccount, roles and bindings (its `values` case), less the rules `without` picks."""
    from tests.unit.test_chart_harnessrl import VALUES, render

    docs = [d for d in render(VALUES[values])
            if d["kind"] in ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    for doc in docs:
        if "rules" in doc:
            doc["rules"] = [rule for rule in doc["rules"] if not without(rule)]
    return docs


@contextmanager
def operator_as_its_service_account(kube_api: Any, learner_url: str, rbac: list[dict[str, Any]],
                                    namespaces: tuple[str, ...] = (NS,)) -> Iterator[Any]:
    """The operator sending its ServiceAccount's token to an emulator that enforces RBAC (rbac_kube_api), with
    `rbac` stored as an administrator applies a chart."""
    for namespace in {"harnessrl-system", *namespaces}:
        kube_api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube_api.apply(rbac)
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        kube_api.apply(crd)
    with running_operator(kube_api, learner_url, token=OPERATOR_TOKEN, namespaces=namespaces):
        yield kube_api


def test_the_operator_lives_a_run_through_with_only_its_chart_roles(rbac_kube_api: Any,
                                                                     learner_status: FakeLearnerStatus) -> None:
    """A run's whole life (created, its sandbox pool's RoleBinding, training, complete, scaled to zero, deleted),
    watched and reconciled by kopf and the operator's cache, on a server that authorizes every request by RBAC
    and enforces owner-reference permissions (blockOwnerDeletion needs update on the owner's finalizers, as
    OpenShift's default admission does): the chart's roles are enough, the server refuses nothing."""
    with operator_as_its_service_account(rbac_kube_api, learner_status.url, chart_rbac()) as operator:
        apply_pools(operator, "codex")
        operator.apply(small_run(harnesses=[{"pool": "codex"}]))
        operator.wait_for(lambda: operator.get("rbac.authorization.k8s.io/v1", "RoleBinding", "run-a-codex-runner",
                                               namespace=NS), timeout=15)
        operator.patch("batch/v1", "Job", "run-a-learner", {"status": {"active": 0, "succeeded": 1, "conditions": [
            {"type": "Complete", "status": "True"}]}}, namespace=NS, subresource="status")
        wait_condition(operator, "run-a", "Complete", "True", "TrainingComplete")
        operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)["spec"]["replicas"] == 0)
        operator.delete(*TR, "run-a", namespace=NS)
        operator.wait_for(lambda: operator.get(*TR, "run-a", namespace=NS) is None)
    sent = {r.headers.get("Authorization") for r in list(rbac_kube_api.emulator._requests)
            if not r.headers.get("User-Agent", "").startswith("python-httpx")}
    assert sent == {f"Bearer {OPERATOR_TOKEN}"}  # kopf, the cache and the reconciler all sent the operator's token
    assert rbac_kube_api.emulator.refusals == []


@pytest.mark.parametrize(("without", "child", "server_says"), [
    # OpenShift's default: a child that blocks its owner's deletion needs update on the owner's finalizers.
    (lambda rule: any(r.endswith("/finalizers") for r in rule["resources"]), "Secret run-a-proxy-admin",
     "is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set "
     "finalizers on: , <nil>"),
    # The runners' RoleBinding grants a role the operator does not hold: only its `bind` rule allows it.
    (lambda rule: "bind" in rule["verbs"], "RoleBinding run-a-codex-runner",
     'rolebindings.rbac.authorization.k8s.io "run-a-codex-runner" is forbidden: user '
     '"system:serviceaccount:harnessrl-system:harnessrl" (groups=["system:serviceaccounts" '
     '"system:serviceaccounts:harnessrl-system" "system:authenticated"]) is attempting to grant RBAC permissions '
     'not currently held:\n{APIGroups:[""], Resources:["pods"], Verbs:["create" "delete"]}\n'
     '{APIGroups:[""], Resources:["pods/exec"], Verbs:["create" "get"]}\n'
     '{APIGroups:[""], Resources:["pods/log"], Verbs:["get"]}'),
], ids=["no-finalizers-rule", "no-bind-rule"])
def test_a_right_the_chart_lacks_is_a_condition_with_the_servers_refusal(
        rbac_kube_api: Any, learner_status: FakeLearnerStatus, without: Callable[[dict[str, Any]], bool], child: str,
        server_says: str) -> None:
    """Each of these chart rules is needed: without it the server refuses a child, and the run says which and why."""
    with operator_as_its_service_account(rbac_kube_api, learner_status.url, chart_rbac(without)) as operator:
        apply_pools(operator, "codex")
        operator.apply(small_run(harnesses=[{"pool": "codex"}]))
        cond = operator.wait_for(lambda: (c := condition(operator, "run-a", "Ready")) and c["reason"] == CHILD_REFUSED
                                 and c, timeout=20)
        assert child in cond["message"] and server_says in cond["message"], cond["message"]
        assert any(server_says.split(":")[0] in refusal for refusal in operator.emulator.refusals)


def test_a_namespaced_install_serves_its_namespaces_with_their_roles_and_relists_each_alone(
        rbac_kube_api: Any, learner_status: FakeLearnerStatus) -> None:
    """The chart's namespaced install (watch.namespaces: team-a, team-b; its Roles exist in those two only): the
    operator, sending its ServiceAccount's token, gives a run in each namespace every child and leaves a run in
    team-c alone; the server refuses it nothing. Then every watch ends and the history is compacted, so each
    namespace's reflectors list again (410): a relist of one namespace must keep the other's children in the
    cache, or the next resyncs would create or patch them again. Nothing is written."""
    api, watched = rbac_kube_api, ("team-a", "team-b")
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-c"}})
    with operator_as_its_service_account(api, learner_status.url, chart_rbac(values="namespaced"), watched):
        pool = yaml.safe_load((ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml").read_text())
        for namespace in (*watched, "team-c"):
            api.apply({**pool, "metadata": {**pool["metadata"], "namespace": namespace}})
            run = small_run()
            api.apply({**run, "metadata": {**run["metadata"], "namespace": namespace}})
        for namespace in watched:  # the NetworkPolicies are rendered last: once they exist, every child does
            api.wait_for(lambda ns=namespace: api.get("networking.k8s.io/v1", "NetworkPolicy", "run-a-engine",
                                                      namespace=ns), timeout=20)
        assert api.list_objects("apps/v1", "StatefulSet", "team-c") == []
        assert not (api.get(*TR, "run-a", namespace="team-c") or {}).get("status")

        def resyncs(count: int) -> None:
            start = reconciles(api, "run-a")  # of the runs in both namespaces
            api.wait_for(lambda: reconciles(api, "run-a") >= start + count, timeout=20)

        resyncs(10)  # the runs' and pools' status settle
        api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated", "namespace": "team-c"}})
        mark = len(api.emulator._requests)
        api.call(lambda emulator: (emulator.close_watches(), emulator.store.compact()))

        def relisted(namespace: str) -> bool:
            return any(r.url.path == f"/api/v1/namespaces/{namespace}/configmaps" and "watch" not in r.params
                       for r in list(api.emulator._requests)[mark:])

        api.wait_for(lambda: all(relisted(ns) for ns in watched), timeout=20)
        resyncs(10)
        writes = [f"{r.method} {r.url.path}" for r in list(api.emulator._requests)[mark:]
                  if str(getattr(r.method, "value", r.method)) in ("POST", "PUT", "PATCH", "DELETE")
                  and r.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}" and "/events" not in r.url.path]
        assert writes == []
    assert api.emulator.refusals == []


def test_operator_restart_creates_no_duplicates(cluster: Any, learner_status: FakeLearnerStatus) -> None:
    apply_pools(cluster, "mini-swe-agent")
    cluster.apply(small_run())
    with running_operator(cluster, learner_status.url):
        # The NetworkPolicies are rendered last: once they exist, every child does.
        cluster.wait_for(lambda: cluster.get("networking.k8s.io/v1", "NetworkPolicy", "run-a-engine", namespace=NS))
        before = {(k, n): cluster.get(*_kind(k), n, namespace=NS)["metadata"]["uid"] for k, n in children(cluster, "run-a")}
        tokens = {name: cluster.get("v1", "Secret", name, namespace=NS)["data"]["token"]
                  for name in ("run-a-proxy-admin", "run-a-runner-token")}
    with running_operator(cluster, learner_status.url):
        reconciled_after_a_spec_change(cluster, "run-a")  # by the restarted operator
        after = {(k, n): cluster.get(*_kind(k), n, namespace=NS)["metadata"]["uid"] for k, n in children(cluster, "run-a")}
    assert after == before  # same objects (same uids), none added
    assert {name: cluster.get("v1", "Secret", name, namespace=NS)["data"]["token"] for name in tokens} == tokens


def test_deleting_a_run_with_the_operator_stopped_does_not_hang(cluster: Any, learner_status: FakeLearnerStatus) -> None:
    apply_pools(cluster, "mini-swe-agent")
    cluster.apply(small_run())
    with running_operator(cluster, learner_status.url):
        cluster.wait_for(lambda: cluster.get("batch/v1", "Job", "run-a-learner", namespace=NS))
        wait_condition(cluster, "run-a", "Training", "False")
    assert cluster.get(*TR, "run-a", namespace=NS)["metadata"].get("finalizers") in (None, [])
    cluster.delete(*TR, "run-a", namespace=NS)
    assert cluster.get(*TR, "run-a", namespace=NS) is None
    assert children(cluster, "run-a") == {RETAINED}  # checkpointRetention Retain (the default)


def writes_to(kube_api: Any, path_suffix: str) -> list[str]:
    """The PATCH/PUT/DELETE requests the emulator served on paths ending in `path_suffix` (its request log)."""
    served = [(getattr(r.method, "value", r.method), r.url.path) for r in list(kube_api.emulator._requests)]
    return [f"{method} {path}" for method, path in served
            if method in ("PATCH", "PUT", "DELETE") and path.endswith(path_suffix)]


def test_quantities_the_server_rewrites_cause_no_patches_at_rest(operator: Any) -> None:
    """The API server stores 0.5 CPU as 500m and 1024Mi as 1Gi: compared as text, every resync would patch the
    proxy, runners, engine and learner again, for ever. Compared as amounts, nothing is written at rest."""
    apply_pools(operator, "mini-swe-agent")
    amounts = {"requests": {"cpu": "0.5", "memory": "1024Mi"}, "limits": {"cpu": "1000m", "memory": "2048Mi"}}
    operator.apply(small_run(proxy={"resources": amounts}, engine={"gpus": 1, "resources": amounts},
                             learner={"resources": amounts}))
    proxy = operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS))
    stored = proxy["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert stored == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    reconciled_after_a_spec_change(operator, "run-a")
    workloads = ("/statefulsets/", "/deployments/", "/jobs/", "/services/", "/configmaps/", "/networkpolicies/")

    def child_writes() -> list[str]:
        return [w for w in writes_to(operator, "") if any(k in w for k in workloads)]

    writes, start = len(child_writes()), reconciles(operator, "run-a")
    operator.wait_for(lambda: reconciles(operator, "run-a") >= start + 5, timeout=30)  # resyncs at rest
    assert child_writes()[writes:] == []


def reconciles(kube_api: Any, run: str) -> int:
    """How many reconciles of `run` have started: each starts by reading the run."""
    return sum(1 for r in list(kube_api.emulator._requests)
               if getattr(r.method, "value", r.method) == "GET" and r.url.path.endswith(f"/trainingruns/{run}"))


def test_resyncs_read_children_from_label_filtered_watches_not_lists(operator: Any) -> None:
    """The operator keeps its children in a cache fed by one watch per kind, filtered by its managed-by label on
    the server: a resync reads them from memory, not with a LIST per kind and run."""
    apply_pools(operator, "mini-swe-agent")
    operator.apply(small_run())
    reconciled_after_a_spec_change(operator, "run-a")
    handlers = "OpenAPI-Generator"  # the official client's user agent: the reconcilers' requests, not kopf's or ours

    def collection_reads() -> list[Any]:
        return [r for r in list(operator.emulator._requests) if getattr(r.method, "value", r.method) == "GET"
                and r.headers.get("User-Agent", "").startswith(handlers) and r.url.path.split("/")[-1] in CACHED]

    before, start = len(collection_reads()), reconciles(operator, "run-a")
    operator.wait_for(lambda: reconciles(operator, "run-a") >= start + 5, timeout=30)  # resyncs at rest
    lists = [f"{r.url.path}?{r.url.query_string}" for r in collection_reads()[before:]]
    assert lists == []
    watched = {r.url.path.split("/")[-1]: dict(r.url.query) for r in collection_reads() if r.url.query.get("watch")}
    assert set(watched) == CACHED
    assert {q["labelSelector"] for q in watched.values()} == {"app.kubernetes.io/managed-by=harnessrl-operator"}


def test_an_object_another_owner_holds_is_never_adopted_or_changed(operator: Any) -> None:
    """A child's name taken by another controller's object, or by an earlier run of the same name (another uid):
    the operator writes nothing to it, says who holds it (ChildConflict), and retries until it is gone."""
    apply_pools(operator, "mini-swe-agent")
    holder = operator.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else", "namespace": NS}})[0]
    theirs = {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone-else", "uid": holder["metadata"]["uid"],
              "controller": True}
    foreign = operator.apply({"apiVersion": "v1", "kind": "ConfigMap", "data": {"config.yaml": "theirs"},
                              "metadata": {"name": "run-a-engine-config", "namespace": NS, "ownerReferences": [theirs]}})[0]
    earlier_run = {"apiVersion": TR[0], "kind": TR[1], "name": "run-a", "uid": "0d4c1e8e-earlier", "controller": True,
                   "blockOwnerDeletion": True}
    old = {"app": "old"}
    # Its owner is gone, so the garbage collector deletes it, but a finalizer (someone's cleanup) holds it.
    operator.apply({"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "metadata": {"name": "run-a-proxy", "namespace": NS, "ownerReferences": [earlier_run],
                                 "finalizers": ["example.com/cleanup"]},
                    "spec": {"serviceName": "x", "selector": {"matchLabels": old}, "template": {
                        "metadata": {"labels": old}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}})
    operator.apply(small_run())
    cond = wait_condition(operator, "run-a", "Ready", "False", "ChildConflict")
    assert "ConfigMap run-a-engine-config" in cond["message"] and f"ConfigMap someone-else uid {theirs['uid']}" in cond["message"]
    reconciled_after_a_spec_change(operator, "run-a")
    live = operator.get("v1", "ConfigMap", "run-a-engine-config", namespace=NS)
    assert live["data"] == {"config.yaml": "theirs"} and live["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]
    assert writes_to(operator, "/configmaps/run-a-engine-config") == []
    operator.delete("v1", "ConfigMap", "run-a-engine-config", namespace=NS)
    cond = operator.wait_for(lambda: (c := condition(operator, "run-a", "Ready")) and "StatefulSet run-a-proxy" in c["message"] and c,
                             timeout=30)
    assert cond["reason"] == "ChildConflict" and "TrainingRun run-a uid 0d4c1e8e-earlier (an earlier object" in cond["message"]
    assert writes_to(operator, "/statefulsets/run-a-proxy") == []  # not replaced either, though it selects other Pods
    operator.patch("apps/v1", "StatefulSet", "run-a-proxy", {"metadata": {"finalizers": None}}, namespace=NS)
    uid = operator.get(*TR, "run-a", namespace=NS)["metadata"]["uid"]
    operator.wait_for(lambda: ((o := operator.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)) is not None
                               and o["metadata"]["ownerReferences"][0]["uid"] == uid), timeout=30)
    operator.wait_for(lambda: condition(operator, "run-a", "Ready")["reason"] != "ChildConflict", timeout=15)
    assert operator.get("v1", "ConfigMap", "run-a-engine-config", namespace=NS)["metadata"]["ownerReferences"][0]["uid"] == uid
    assert [e for e in operator.list_objects("v1", "Event", NS) if e["reason"] == "ChildConflict"]


def test_checkpoints_are_retained_after_deletion_and_never_taken_over(operator: Any) -> None:
    """checkpointRetention Retain (the default): the run's checkpoint claim outlives the run, labelled with its
    name and uid; a new run of the same name does not take it over (ChildConflict) until it is deleted. With
    Delete, the claim goes with the run."""
    apply_pools(operator, "mini-swe-agent")
    claim = ("v1", "PersistentVolumeClaim", "run-a-checkpoints")
    first = operator.apply(small_run())[0]["metadata"]["uid"]
    kept = operator.wait_for(lambda: operator.get(*claim, namespace=NS))
    assert not kept["metadata"].get("ownerReferences")
    assert kept["metadata"]["labels"]["harnessrl.io/run"] == "run-a" and kept["metadata"]["labels"]["harnessrl.io/run-uid"] == first
    # Deleted only once its reconcile has written its children: one it wrote after the delete would be a stale
    # object of the first run that the second run's conflict names before the claim (seen in CI).
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-a-learner", namespace=NS))
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS))
    operator.delete(*TR, "run-a", namespace=NS)
    assert operator.get("batch/v1", "Job", "run-a-learner", namespace=NS) is None
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS) is None)
    assert operator.get(*claim, namespace=NS)["metadata"]["uid"] == kept["metadata"]["uid"]
    # Same name, new uid: the retained claim is not this run's.
    second = operator.apply(small_run())[0]["metadata"]["uid"]
    cond = wait_condition(operator, "run-a", "Ready", "False", "ChildConflict")
    assert f"PersistentVolumeClaim run-a-checkpoints already exists and belongs to the run run-a uid {first}" in cond["message"]
    assert operator.get(*claim, namespace=NS)["metadata"]["labels"]["harnessrl.io/run-uid"] == first
    operator.delete(*claim, namespace=NS)
    # The next try comes after the conflict's backoff (doubling from the resync period): long on a busy machine.
    fresh = operator.wait_for(lambda: (c := operator.get(*claim, namespace=NS)) and c, timeout=60)
    assert fresh["metadata"]["labels"]["harnessrl.io/run-uid"] == second
    # Delete: the claim converges on an ownerReference to the run, and goes with it.
    operator.patch(*TR, "run-a", {"spec": {"learner": {"checkpointRetention": "Delete"}}}, namespace=NS)
    operator.wait_for(lambda: [r["uid"] for r in operator.get(*claim, namespace=NS)["metadata"].get("ownerReferences") or []]
                      == [second])
    operator.delete(*TR, "run-a", namespace=NS)
    assert operator.get(*claim, namespace=NS) is None


def test_a_run_cannot_take_another_live_runs_checkpoint_claim(operator: Any) -> None:
    """Run B names run A's checkpoint claim in checkpointClaimName while A lives: B would resume from A's checkpoints
    and prune them. B is refused with a condition and gets no learner; once A is deleted (its claim retained), B
    resumes from it, as checkpointClaimName is for."""
    apply_pools(operator, "mini-swe-agent")
    a_uid = operator.apply(small_run("run-a"))[0]["metadata"]["uid"]
    operator.wait_for(lambda: operator.get("v1", "PersistentVolumeClaim", "run-a-checkpoints", namespace=NS))
    operator.apply(small_run("run-b", learner={"checkpointClaimName": "run-a-checkpoints"}))
    cond = wait_condition(operator, "run-b", "Ready", "False", "CheckpointClaimInUse")
    assert f"claim run-a-checkpoints belongs to TrainingRun run-a (uid {a_uid}), which is still live" in cond["message"]
    assert operator.get("batch/v1", "Job", "run-b-learner", namespace=NS) is None
    # Nor through the label of A's other volumes (a claim labelled harnessrl.io/run=run-a).
    operator.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {
        "name": "journal-run-a-proxy-0", "namespace": NS, "labels": {"harnessrl.io/run": "run-a"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    operator.apply(small_run("run-c", learner={"checkpointClaimName": "journal-run-a-proxy-0"}))
    wait_condition(operator, "run-c", "Ready", "False", "CheckpointClaimInUse")
    # A is gone, its claim retained: B may resume from it.
    operator.delete(*TR, "run-a", namespace=NS)
    operator.wait_for(lambda: operator.get("batch/v1", "Job", "run-b-learner", namespace=NS), timeout=30)


def as_an_older_operator_made_it(live: dict[str, Any]) -> dict[str, Any]:
    """The object as operator versions before harnessrl.io/run made it: selecting on app.kubernetes.io/instance
    and app.kubernetes.io/component (the same ownerReference)."""
    old_keys = {"harnessrl.io/run": "app.kubernetes.io/instance", "harnessrl.io/component": "app.kubernetes.io/component"}

    def relabel(node: Any) -> Any:
        if isinstance(node, dict):
            return {old_keys.get(k, k): relabel(v) for k, v in node.items()}
        return [relabel(v) for v in node] if isinstance(node, list) else node

    meta = {k: v for k, v in live["metadata"].items() if k in ("name", "namespace", "labels", "ownerReferences")}
    return {"apiVersion": live["apiVersion"], "kind": live["kind"], "metadata": relabel(meta), "spec": relabel(live["spec"])}


def test_workloads_an_older_operator_made_are_replaced_with_an_event(cluster: Any, learner_status: FakeLearnerStatus) -> None:
    """Upgrading from an operator that selected on app.kubernetes.io/instance: a StatefulSet's or Deployment's
    selector and a Job's Pod template cannot change, so each such workload is deleted and created again."""
    apply_pools(cluster, "mini-swe-agent")
    cluster.apply(small_run())
    workloads = [("apps/v1", "StatefulSet", "run-a-proxy"), ("apps/v1", "Deployment", "run-a-mini-swe-agent-runner"),
                 ("batch/v1", "Job", "run-a-learner")]
    with running_operator(cluster, learner_status.url):
        cluster.wait_for(lambda: cluster.get("networking.k8s.io/v1", "NetworkPolicy", "run-a-engine", namespace=NS))
    legacy = {}
    for api_version, kind, name in workloads:
        old = as_an_older_operator_made_it(cluster.get(api_version, kind, name, namespace=NS))
        cluster.delete(api_version, kind, name, namespace=NS)
        legacy[name] = cluster.apply(old)[0]["metadata"]["uid"]
    assert "harnessrl.io/run" not in cluster.get("apps/v1", "StatefulSet", "run-a-proxy", namespace=NS)["spec"]["selector"]["matchLabels"]
    with running_operator(cluster, learner_status.url):
        for api_version, kind, name in workloads:
            replaced = cluster.wait_for(lambda a=api_version, k=kind, n=name: (
                (o := cluster.get(a, k, n, namespace=NS)) is not None and o["metadata"]["uid"] != legacy[n] and o))
            labels = replaced["spec"]["template"]["metadata"]["labels"]
            assert labels["harnessrl.io/run"] == "run-a" and "app.kubernetes.io/instance" not in labels, name
            assert replaced["metadata"]["ownerReferences"][0]["name"] == "run-a"
        def replaced_events() -> list[dict[str, Any]]:
            return [e for e in cluster.list_objects("v1", "Event", NS) if e["reason"] == "ChildReplaced"]

        events = cluster.wait_for(lambda: len(found := replaced_events()) == 3 and found)
        assert {e["type"] for e in events} == {"Warning"}
        assert any("StatefulSet run-a-proxy: its selector" in e["message"] for e in events)
        reconciled_after_a_spec_change(cluster, "run-a")  # and nothing is replaced again
        assert len(replaced_events()) == 3


def test_a_runner_binding_to_an_older_role_is_replaced(operator: Any) -> None:
    """An older operator bound runners to a per-pool Role; roleRef cannot change, so the binding is recreated
    bound to the sandbox ClusterRole."""
    apply_pools(operator, "codex")
    operator.apply(small_run(harnesses=[{"pool": "codex"}]))
    rb = ("rbac.authorization.k8s.io/v1", "RoleBinding", "run-a-codex-runner")
    current = operator.wait_for(lambda: operator.get(*rb, namespace=NS))
    legacy = current | {"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "run-a-codex-runner"}}
    with pytest.raises(KubeApiError, match="cannot change roleRef"):  # as a real server refuses it
        operator.apply(legacy)
    operator.delete(*rb, namespace=NS)
    old_uid = operator.apply({k: v for k, v in legacy.items() if k != "metadata"} | {"metadata": {
        k: v for k, v in current["metadata"].items() if k in ("name", "namespace", "labels", "ownerReferences")}})[0]["metadata"]["uid"]
    replaced = operator.wait_for(lambda: (o := operator.get(*rb, namespace=NS)) and o["metadata"]["uid"] != old_uid and o)
    assert replaced["roleRef"]["kind"] == "ClusterRole"


def _kind(kind: str) -> tuple[str, str]:
    return next((a, k) for a, k in CHILD_KINDS if k == kind)


def test_a_namespace_enforcing_restricted_accepts_every_pod_the_operator_creates(
        cluster: Any, learner_status: FakeLearnerStatus) -> None:
    """Every Pod the operator's workloads would make, and every sandbox Pod its runners would make, is admitted
    by a namespace enforcing Pod Security `restricted` (the emulator evaluates it as the server does)."""
    cluster.patch("v1", "Namespace", NS, {"metadata": {"labels": {pod_security.ENFORCE: "restricted",
                                                                   pod_security.WARN: "restricted"}}})
    cluster.apply(ROOT / "tests" / "fixtures" / "crds" / "jobsets.jobset.x-k8s.io.yaml")
    cluster.apply(ROOT / "tests" / "fixtures" / "crds" / "workloads.kueue.x-k8s.io.yaml")  # the example is queued
    pools = ("claude-code", "codex", "mini-swe-agent", "gemini-cli", "custom")
    apply_pools(cluster, *pools)
    cluster.apply(ROOT / "examples" / "trainingrun.yaml")  # Hub model (download init), LoRA (adapter store)
    # A task image (copy init), a multi-node learner (JobSet), the custom harness.
    cluster.apply(small_run("run-b", tasks={"image": {"image": "ghcr.io/org/tasks:v1"}}, learner={"gpus": 2, "nodes": 2},
                            harnesses=[{"pool": "my-agent"}]))
    workloads = [("apps/v1", "StatefulSet"), ("apps/v1", "Deployment"), ("batch/v1", "Job"),
                 ("jobset.x-k8s.io/v1alpha2", "JobSet")]

    def templates() -> dict[str, dict[str, Any]]:
        found = {}
        for api_version, kind in workloads:
            for obj in cluster.list_objects(api_version, kind, NS):
                spec = obj["spec"]
                if kind == "JobSet":
                    spec = spec["replicatedJobs"][0]["template"]["spec"]
                found[f"{kind}/{obj['metadata']['name']}"] = spec["template"]
        return found

    with running_operator(cluster, learner_status.url):
        # Each run's engine, proxy and learner, and its runners (4 pools, eval-only gemini-cli included; 1).
        found = cluster.wait_for(lambda: t if len(t := templates()) == 3 + 4 + 3 + 1 else None, timeout=20)
    assert any(t["spec"].get("initContainers") for t in found.values())
    for n, (name, template) in enumerate(sorted(found.items())):
        assert pod_security.violations("restricted", template["spec"]) == [], name
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"pod-{n}", "labels": template["metadata"]["labels"]},
               "spec": template["spec"]}
        cluster.apply(pod)  # as the workload's controller would; a refusal raises KubeApiError 403
    # The sandbox Pods the kubernetes-sandbox runners create, from the config the operator rendered for them.
    sandboxes = 0
    for config_map in cluster.list_objects("v1", "ConfigMap", NS, label_selector="harnessrl.io/component=runner"):
        sandbox = yaml.safe_load(config_map["data"]["config.yaml"])["sandbox"]
        if sandbox["kind"] == "kubernetes":
            config = KubernetesSandboxConfig.model_validate(sandbox)
            cluster.apply(sandbox_pod(config, f"sandbox-{sandboxes}", {}, deadline_s=60))
            sandboxes += 1
    assert sandboxes == 3  # claude-code, codex, my-agent


def test_usage_lands_in_the_runs_status_and_in_prometheus(cluster: Any, learner_status: FakeLearnerStatus) -> None:
    """GPU-seconds from the run's running Pods, rollouts, sandbox time and tokens from its learner: in
    status.usage and as `harnessrl_run_*` counters labelled by namespace and run (chargeback)."""
    options = OperatorOptions(resync_seconds=0.3, learner_url_template=learner_status.url, request_timeout_s=5)
    registry, ctx = build_registry(options, cluster.client())
    apply_pools(cluster, "mini-swe-agent")
    cluster.apply(small_run(learner={"gpus": 4}))
    started = (datetime.now(UTC) - timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with cluster.kopf_runner(registry, namespace=NS):
        cluster.wait_for(lambda: cluster.get("batch/v1", "Job", "run-a-learner", namespace=NS), timeout=15)
        make_pod(cluster, "run-a", "learner", "run-a-learner-0", {"phase": "Running", "startTime": started}, gpus=4)
        learner_status.report(step=1, policy_version=1, tokens_trained=5000,
                              pools={"mini-swe-agent": {"completed": 7, "failed": 1, "sampled_tokens": 900,
                                                        "sandbox_seconds": 420.0}})
        cluster.patch("batch/v1", "Job", "run-a-learner", {"status": {"active": 1, "ready": 1}}, namespace=NS,
                      subresource="status")
        usage = cluster.wait_for(lambda: (u := (cluster.get(*TR, "run-a", namespace=NS).get("status") or {})
                                          .get("usage") or {}).get("tokensTrained") and u, timeout=15)
    assert usage["gpuSeconds"]["learner"] >= 4 * 120
    assert (usage["rollouts"], usage["sandboxSeconds"], usage["tokensSampled"]) == (8, 420.0, 900)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(ctx.metrics.registry).decode()) for s in f.samples}
    run = (("namespace", NS), ("run", "run-a"))
    assert samples[("harnessrl_run_gpu_seconds_total", (("component", "learner"), *run))] == usage["gpuSeconds"]["learner"]
    assert samples[("harnessrl_run_tokens_total", (("kind", "trained"), *run))] == 5000
    assert samples[("harnessrl_run_sandbox_seconds_total", run)] == 420.0
