"""Attacks of another tenant's Pods on a run's network, evaluated against the NetworkPolicies the operator renders
(tests/kube_emulator/network_policy.py decides as a CNI would: the emulator has no Pod network).

Tenant B owns namespace team-b and may label its own Pods as it likes, so it labels one as the operator. The
operator runs in harnessrl-system."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from harnessrl.operator.api.enginepool import EnginePoolSpec
from harnessrl.operator.api.harnesspool import HarnessPoolSpec
from harnessrl.operator.api.trainingrun import TrainingRunSpec
from harnessrl.operator.kube import Owner, engine, render
from harnessrl.operator.plan import build_plan
from harnessrl.operator.plan.engine import build_engine_pool_plan
from harnessrl.operator.plan.placement import ClusterPlacement

from tests.kube_emulator.network_policy import PodRef, connection_allowed

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
CODEX = HarnessPoolSpec.model_validate(yaml.safe_load((ROOT / "examples" / "harnesspools" / "codex.yaml").read_text())["spec"])
POOL = yaml.safe_load((ROOT / "examples" / "enginepools" / "qwen3-8b.yaml").read_text())
OPERATOR_NS = "harnessrl-system"
OPERATOR_LABELS = {"harnessrl.io/component": "operator"}
REAL_OPERATOR = PodRef(OPERATOR_NS, OPERATOR_LABELS)
FAKE_OPERATOR = PodRef("team-b", OPERATOR_LABELS)  # tenant B's own Pod, labelled as the operator


def run_manifests(namespace: str = "team-a") -> list[dict[str, Any]]:
    spec = TrainingRunSpec.model_validate(EXAMPLE["spec"] | {"harnesses": [{"pool": "codex"}], "eval": None})
    plan = build_plan("run", namespace, spec, {"codex": CODEX}, ClusterPlacement(namespace))
    return render(plan, Owner(name="run", uid="uid-a"), operator_namespace=OPERATOR_NS)


def pod_of(manifests: list[dict[str, Any]], kind: str, name: str) -> PodRef:
    workload = next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == (kind, name))
    return PodRef(workload["metadata"]["namespace"], workload["spec"]["template"]["metadata"]["labels"])


def test_a_pod_of_another_namespace_labelled_operator_reaches_no_learner() -> None:
    policies = [m for m in run_manifests() if m["kind"] == "NetworkPolicy"]
    learner = pod_of(run_manifests(), "Job", "run-learner")
    assert connection_allowed(policies, REAL_OPERATOR, learner, 8090)
    assert not connection_allowed(policies, FAKE_OPERATOR, learner, 8090)
    # Nor a Pod of the operator's namespace that is not the operator.
    assert not connection_allowed(policies, PodRef(OPERATOR_NS, {"app": "other"}), learner, 8090)


def test_a_pod_of_another_namespace_labelled_operator_reaches_no_engine_pool_server() -> None:
    plan = build_engine_pool_plan("qwen3-8b", "team-a", EnginePoolSpec.model_validate(POOL["spec"]),
                                  ClusterPlacement("team-a"))
    out = engine.pool_manifests(plan, Owner(name="qwen3-8b", uid="uid-p", kind="EnginePool"), OPERATOR_NS)
    policies = [m for m in out if m["kind"] == "NetworkPolicy"]
    server = pod_of(out, "StatefulSet", "qwen3-8b-enginepool")
    for port in (8000, 8001):  # vLLM (load/unload adapters) and the adapter store
        assert connection_allowed(policies, REAL_OPERATOR, server, port)
        assert not connection_allowed(policies, FAKE_OPERATOR, server, port), port


def test_sandboxes_resolve_names_only_at_the_cluster_dns() -> None:
    out = run_manifests()
    policies = [m for m in out if m["kind"] == "NetworkPolicy"]
    sandbox = PodRef("team-a", {"harnessrl.io/run": "run", "harnessrl.io/component": "sandbox"})
    dns = PodRef("kube-system", {"k8s-app": "kube-dns"})
    for protocol in ("UDP", "TCP"):
        assert connection_allowed(policies, sandbox, dns, 53, protocol)
        # A listener on port 53 anywhere else is an exfiltration channel.
        for listener in (PodRef("team-b", {"app": "dns"}), PodRef("kube-system", {"app": "other"}),
                         PodRef("team-b", {"k8s-app": "kube-dns"})):
            assert not connection_allowed(policies, sandbox, listener, 53, protocol), (listener, protocol)


def test_a_runner_cannot_borrow_another_runs_sandbox_policy_by_its_id() -> None:
    """Runs a and b share a namespace. The sandbox admission policy makes a's runner label its Pods as run a's
    sandboxes, but the sandbox id label is its to choose: it gives a Pod run b's id, so that b's per-sandbox
    NetworkPolicy (egress to b's proxy) selects it too. b's proxy admits any source when b has an E2B pool (its
    sandboxes call from outside the cluster); here b's proxy has no ingress policy, which is that case."""
    from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig
    from harnessrl.runtime.harness.sandboxes.kubernetes import network_policy_manifest, sandbox_labels

    def config(run: str) -> KubernetesSandboxConfig:
        return KubernetesSandboxConfig(
            namespace="team-a", image="img", name_prefix=f"{run}.p.",
            labels={"harnessrl.io/run": run, "harnessrl.io/component": "sandbox", "harnessrl.io/pool": "p"},
            proxy_pod_labels={"harnessrl.io/run": run, "harnessrl.io/component": "proxy"})

    a, b = config("a"), config("b")
    b_labels = sandbox_labels(b, "p", "runner-b", "rollout-b", "0123456789abcdef")
    b_policy = network_policy_manifest(b, "b.p.0123456789abcdef", b_labels)
    a_run_policy = next(m for m in run_manifests() if m["kind"] == "NetworkPolicy"
                        and m["spec"]["podSelector"]["matchLabels"].get("harnessrl.io/component") == "sandbox")
    a_run_policy["spec"]["podSelector"]["matchLabels"]["harnessrl.io/run"] = "a"  # run_manifests' run is "run"
    borrower = PodRef("team-a", sandbox_labels(a, "p", "runner-a", "rollout-a", "0123456789abcdef"))
    b_proxy = PodRef("team-a", {"harnessrl.io/run": "b", "harnessrl.io/component": "proxy"})
    b_sandbox = PodRef("team-a", b_labels)
    assert connection_allowed([b_policy, a_run_policy], b_sandbox, b_proxy, 8080)  # b's own sandbox does
    assert not connection_allowed([b_policy, a_run_policy], borrower, b_proxy, 8080)
