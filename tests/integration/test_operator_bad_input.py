"""Bad input reaches the user as a condition, never as a traceback loop: the operator (kopf over HTTP against
the emulator, which refuses children as a 1.33 API server does) turns a refused child, a stored spec or
HarnessPool the current model rejects, into a condition with a reason constant and the server's message.

A property test stores arbitrary objects (the CRDs' schemas loosened, as after a downgrade or a schema
change) and calls the reconcilers directly: they must return, never raise."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api.reasons import CHILD_REFUSED, CONTEXT_TOO_LONG, INVALID_HARNESS_POOL, INVALID_SPEC
from harnessrl.operator.control.apply import ChildRefused, Kube, ensure_child
from harnessrl.operator.handlers import OperatorOptions, build_registry
from harnessrl.operator.handlers import harnesspool as pool_handler
from harnessrl.operator.handlers import trainingrun as run_handler
from harnessrl.operator.handlers.context import Context
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
NS = "default"
TR = ("harnessrl.io/v1alpha1", "TrainingRun")
HP = ("harnessrl.io/v1alpha1", "HarnessPool")
pytestmark = pytest.mark.timeout(120)


def crd(kind: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((ROOT / "crds" / f"{kind}.harnessrl.io.yaml").read_text())
    return crd


def small_run(name: str = "run-a", **spec: Any) -> dict[str, Any]:
    body = {"model": {"base": {"hub": {"repo": "Qwen/Qwen3-0.6B"}}}, "tasks": {"pvc": {"claimName": "tasks"}},
            "harnesses": [{"pool": "mini-swe-agent"}], "grpo": {"steps": 3}} | spec
    return {"apiVersion": TR[0], "kind": TR[1], "metadata": {"name": name, "namespace": NS}, "spec": body}


def condition(kube_api: Any, api: tuple[str, str], name: str, type_: str = "Ready") -> dict[str, Any] | None:
    obj = kube_api.get(*api, name, namespace=NS)
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def wait_reason(kube_api: Any, api: tuple[str, str], name: str, reason: str, timeout: float = 20) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = condition(kube_api, api, name)
        return cond if cond and cond["reason"] == reason else None
    return kube_api.wait_for(check, timeout=timeout)


@pytest.fixture
def operator(kube_api: Any, caplog: pytest.LogCaptureFixture) -> Iterator[Any]:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        kube_api.apply(path)
    kube_api.apply(ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml")
    options = OperatorOptions(resync_seconds=0.3, learner_url_template="http://127.0.0.1:9/{run}", request_timeout_s=5)
    registry, _ = build_registry(options, kube_api.client())
    with caplog.at_level(logging.WARNING, logger="harnessrl"), kube_api.kopf_runner(registry, namespace=NS):
        yield kube_api
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info and r.name.startswith("harnessrl")]
    assert not tracebacks, tracebacks


@pytest.mark.parametrize(("spec", "child", "server_says"), [
    # Requests above limits: the CRD schema has no quantity comparison (ValidateResourceRequirements).
    ({"engine": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}, "StatefulSet run-a-engine",
     'spec.template.spec.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1'),
    # An extended resource must have equal requests and limits.
    ({"learner": {"resources": {"requests": {"example.com/fpga": 1}, "limits": {"example.com/fpga": 2}}}},
     "Job run-a-learner", "must be equal to example.com/fpga limit of 2"),
    # A free-form affinity that is not an Affinity: a decode error (400) for the first child that carries it.
    ({"pod": {"affinity": {"nodeAffinity": "gpu-nodes"}}}, "cannot be handled as a",
     "json: cannot unmarshal string into Go struct field Affinity.spec.template.spec.affinity.nodeAffinity of type v1.NodeAffinity"),
])
def test_a_refused_child_is_a_condition_naming_it_and_a_fix_recovers(operator: Any, spec: dict[str, Any], child: str,
                                                                     server_says: str) -> None:
    operator.apply(small_run(**spec))
    cond = wait_reason(operator, TR, "run-a", CHILD_REFUSED)
    assert cond["status"] == "False"
    assert cond["message"].startswith("the API server refused ") and child in cond["message"], cond["message"]
    assert server_says in cond["message"]
    assert operator.get(*TR, "run-a", namespace=NS)["status"]["phase"] == "Pending"
    # The user fixes the spec: the refusal's backoff ends with the new generation, and the children appear.
    operator.patch(*TR, "run-a", {"spec": dict.fromkeys(spec)}, namespace=NS)  # merge patch: null removes
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS)
                      and operator.get("batch/v1", "Job", "run-a-learner", namespace=NS), timeout=20)
    operator.wait_for(lambda: (c := condition(operator, TR, "run-a")) and c["reason"] != CHILD_REFUSED, timeout=20)


def test_a_context_past_the_models_positions_is_a_condition_and_a_fix_recovers(operator: Any) -> None:
    # Qwen3-1.7B's config allows 40,960 positions: vLLM would refuse to start on 65,536 (a crash loop on GPUs).
    operator.apply(small_run(model={"base": {"hub": {"repo": "Qwen/Qwen3-1.7B"}}}, engine={"maxModelLen": 65536}))
    cond = wait_reason(operator, TR, "run-a", CONTEXT_TOO_LONG)
    assert cond["status"] == "False" and "engine.maxModelLen 65536 exceeds the 40960 positions" in cond["message"]
    assert operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS) is None
    operator.patch(*TR, "run-a", {"spec": {"engine": {"maxModelLen": 40960}}}, namespace=NS)
    operator.wait_for(lambda: operator.get("apps/v1", "StatefulSet", "run-a-engine", namespace=NS), timeout=20)


@pytest.mark.parametrize(("size", "server_says"), [
    (1_600_000, "etcdserver: request is too large"),  # etcd's limit, passed on as a 500
    (3_200_000, "Request entity too large: limit is 3145728"),  # the server's own, a 413
])
def test_a_child_too_large_to_store_is_refused_not_retried(kube_api: Any, size: int, server_says: str) -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "big", "namespace": NS},
           "spec": {"template": {"spec": {"restartPolicy": "Never",
                                          "containers": [{"name": "c", "image": "busybox", "args": ["x" * size]}]}}}}
    with pytest.raises(ChildRefused, match=f"refused Job big: {server_says}$"):
        ensure_child(Kube(kube_api.client()), job)


def test_a_stored_pool_the_model_rejects_is_a_condition_on_the_pool_and_its_runs(operator: Any) -> None:
    # The pool CRD as an older release served it: no patterns. The pool is stored; today's model rejects it.
    older = crd("harnesspools")
    _strip(older, "pattern")
    operator.apply(older)
    pool = yaml.safe_load((ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml").read_text())
    pool["metadata"]["name"] = "legacy"
    pool["spec"]["sandbox"] = {"kubernetes": {"runtimeClassName": "Kata_Containers"}}
    operator.apply(pool)
    operator.apply(small_run(harnesses=[{"pool": "legacy"}]))
    pool_cond = wait_reason(operator, HP, "legacy", INVALID_SPEC)
    assert pool_cond["status"] == "False"
    assert pool_cond["message"].startswith("spec.sandbox.kubernetes.runtimeClassName: String should match pattern")
    run_cond = wait_reason(operator, TR, "run-a", INVALID_HARNESS_POOL)
    assert run_cond["message"].startswith("HarnessPool legacy is invalid: spec.sandbox.kubernetes.runtimeClassName")


def _strip(node: Any, key: str) -> None:
    if isinstance(node, dict):
        node.pop(key, None)
        for value in node.values():
            _strip(value, key)
    elif isinstance(node, list):
        for value in node:
            _strip(value, key)


# -- the reconcilers never raise on a stored object ---------------------------------------------------------
EXAMPLE_RUN = small_run("prop")
EXAMPLE_POOL = yaml.safe_load((ROOT / "examples" / "harnesspools" / "mini-swe-agent.yaml").read_text())
JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**12) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=70) | st.sampled_from(["8", "true", "1e-5", "-1", "500m", "Exists", "lora"]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
                    max_leaves=6)


def _paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix] if prefix else []
    for name, sub in (schema.get("properties") or {}).items():
        out += _paths(sub, (*prefix, name))
    if isinstance(schema.get("items"), dict):
        out += _paths(schema["items"], (*prefix, "0"))
    return out


RUN_PATHS = _paths(crd("trainingruns")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
POOL_PATHS = _paths(crd("harnesspools")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])


def _mutated(spec: dict[str, Any], edits: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for path, value in edits:
        node: Any = out
        for part in path[:-1]:
            if isinstance(node, list):
                if not node:
                    node.append({})
                node = node[0]
            elif isinstance(node, dict):
                node = node.setdefault(part, {}) if isinstance(node.get(part), dict | list) or part not in node else node[part]
            else:
                break
        if isinstance(node, dict):
            node[path[-1]] = value
        elif isinstance(node, list) and node:
            node[0] = value
    return out


@pytest.fixture(scope="module")
def loose_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Context]]:
    """The CRDs with their spec schemas reduced to 'anything' (stored objects of another release)."""
    from tests.fixtures.kube import KubeApi
    from tests.kube_emulator import EmulatorThread

    with EmulatorThread() as thread:  # one emulator for all examples
        kube_api = KubeApi(thread, tmp_path_factory.mktemp("loose"))
        for kind in ("trainingruns", "harnesspools"):
            loose = crd(kind)
            schema = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            schema.pop("x-kubernetes-validations", None)
            kube_api.apply(loose)
        options = OperatorOptions(resync_seconds=0.3, learner_url_template="http://127.0.0.1:9/{run}", request_timeout_s=5)
        yield kube_api, Context(options, kube_api.client())
        kube_api.close()
        assert not thread.faults()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(RUN_PATHS), JSON), min_size=1, max_size=3),
       st.lists(st.tuples(st.sampled_from(POOL_PATHS), JSON), max_size=2))
def test_reconcilers_never_raise_on_a_stored_object(loose_cluster: tuple[Any, Context],
                                                     run_edits: list[Any], pool_edits: list[Any]) -> None:
    kube_api, ctx = loose_cluster
    pool = copy.deepcopy(EXAMPLE_POOL)
    pool["spec"] = _mutated(pool["spec"], pool_edits)
    run = copy.deepcopy(EXAMPLE_RUN)
    run["spec"] = _mutated(run["spec"], run_edits)
    for obj in (pool, run):
        kube_api.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], namespace=NS)
        kube_api.apply(obj)
    run_handler.reconcile(ctx, NS, "prop")  # must return: a condition, never an exception
    pool_handler.reconcile(ctx, NS, pool["metadata"]["name"])
    stored = kube_api.get(*TR, "prop", namespace=NS)
    assert (stored.get("status") or {}).get("conditions"), "the run got no condition"


REFUSED = sorted((ROOT / "examples" / "invalid" / "refused").glob("*.yaml"))


@pytest.mark.timeout(240)
def test_every_refused_example_is_a_condition_with_the_servers_message(operator: Any) -> None:
    """examples/invalid/refused/: accepted at admission, refused by the API server as children."""
    runs = {}
    for path in REFUSED:
        documents = operator.apply(path)
        (run,) = [d for d in documents if d["kind"] == "TrainingRun"]
        expected = next(line.removeprefix("# expect-condition:").strip() for line in path.read_text().splitlines()
                        if line.startswith("# expect-condition:"))
        runs[run["metadata"]["name"]] = expected
    for name, expected in runs.items():
        cond = wait_reason(operator, TR, name, CHILD_REFUSED, timeout=90)  # nine runs share four workers
        assert expected in cond["message"], (name, cond["message"])
    assert len(REFUSED) >= 8


def test_the_pool_shows_the_harness_version_it_runs(operator: Any) -> None:
    from harnessrl.runtime.contracts.harness_versions import pin

    pool = operator.wait_for(lambda: (p := operator.get(*HP, "mini-swe-agent", namespace=NS))
                             and (p.get("status") or {}).get("harnessVersion") and p)
    assert pool["status"]["harnessVersion"] == pin("mini-swe-agent").version  # unpinned in the example: the pin
    assert "version" not in pool["spec"]["harness"]["known"]
    columns = {c["name"]: c["jsonPath"] for c in crd("harnesspools")["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Version"] == ".status.harnessVersion"
