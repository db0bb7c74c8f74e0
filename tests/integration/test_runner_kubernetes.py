"""The kubernetes sandbox against the API emulator (tests/kube_emulator, over HTTP with the official client).

A helper thread plays the kubelet (marks Pods Running); the emulator serves `pods/exec` over WebSocket in the
channel protocol the official client's `stream()` speaks, running each command in bubblewrap with the Pod's
emptyDir volumes at their mount paths (tests/kube_emulator/podexec.py). So the objects, their lifecycle and
reaping, and the exec path (files in and out, stdout/stderr, exit codes, timeouts, grading, a dropped
connection) are exercised through the real client.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.runtime.contracts.runner_config import KubernetesSandboxConfig, Resources
from harnessrl.runtime.harness.sandboxes import kubernetes
from harnessrl.runtime.harness.sandboxes.base import SandboxError
from harnessrl.runtime.harness.sandboxes.kubernetes import STDERR_LIMIT, STDOUT_LIMIT, KubernetesProvider
from harnessrl.runtime.harness.tasks import load_dir

from tests.fixtures.kube import running_emulator
from tests.fixtures.left_behind import leave_walker
from tests.fixtures.raw_http import peak_rss_mb
from tests.kube_emulator import pod_security
from tests.kube_emulator.authz import service_account
from tests.kube_emulator.client import KubeApiError
from tests.unit.test_chart_harnessrl import render as render_chart
from tests.unit.test_two_tenants import children

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
POOL_SANDBOX = KubernetesSandboxConfig(
    namespace="default",
    image="ghcr.io/harnessrl/harness-claude-code:2.1.197",
    runtime_class_name="gvisor",
    resources=Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "4Gi"}),
    node_selector={"pool": "agents"},
    labels={"team": "rl"},
    name_prefix="run.claude-pool.",
    proxy_pod_labels={"app.kubernetes.io/name": "harnessrl-proxy"},
    proxy_port=8080,
    pod_start_timeout_s=10,
)
SELECTOR = "app.kubernetes.io/managed-by=harnessrl"


def provider(kube_api: Any, runner_id: str = "runner-0") -> KubernetesProvider:
    return KubernetesProvider(POOL_SANDBOX, pool="claude-pool", runner_id=runner_id, api_client=kube_api.client())


def sandboxes(kube_api: Any) -> tuple[list[str], list[str]]:
    pods = kube_api.list_objects("v1", "Pod", "default", label_selector=SELECTOR)
    policies = kube_api.list_objects("networking.k8s.io/v1", "NetworkPolicy", "default", label_selector=SELECTOR)
    return sorted(p["metadata"]["name"] for p in pods), sorted(p["metadata"]["name"] for p in policies)


def test_pod_and_network_policy_are_what_the_pool_says(kube_api: Any) -> None:
    # The namespace enforces Pod Security "restricted" (the emulator refuses a violating Pod with 403).
    kube_api.patch("v1", "Namespace", "default", {"metadata": {"labels": {pod_security.ENFORCE: "restricted"}}})
    prov = provider(kube_api)
    name = prov.create("rollout-1")
    pod = kube_api.get("v1", "Pod", name, "default")
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "gvisor" and spec["nodeSelector"] == {"pool": "agents"}
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["activeDeadlineSeconds"] > 0 and "ownerReferences" not in pod["metadata"]
    assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["runAsNonRoot"] is True
    (container,) = spec["containers"]
    assert container["image"] == POOL_SANDBOX.image
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/workspace", "/home/agent", "/tests", "/logs"}
    labels = pod["metadata"]["labels"]
    sandbox_id = name.removeprefix("run.claude-pool.")
    assert len(sandbox_id) == 16 and name == "run.claude-pool." + sandbox_id  # the prefix the policy lets it exec into
    assert labels == {"team": "rl", "app.kubernetes.io/managed-by": "harnessrl", "harnessrl.io/pool": "claude-pool",
                      "harnessrl.io/runner": "runner-0", "harnessrl.io/rollout": "rollout-1",
                      "harnessrl.io/sandbox": sandbox_id}

    policy = kube_api.get("networking.k8s.io/v1", "NetworkPolicy", name, "default")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"team": "rl", "harnessrl.io/sandbox": sandbox_id}}  # its run's labels too
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    to_proxy, to_dns = policy["egress"]
    assert to_proxy == {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "harnessrl-proxy"}}}],
                        "ports": [{"protocol": "TCP", "port": 8080}]}
    assert {p["port"] for p in to_dns["ports"]} == {53}
    assert to_dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}

    prov.delete(name)
    assert sandboxes(kube_api) == ([], [])


def play_kubelet(kube_api: Any, stop: threading.Event) -> None:
    """Mark every sandbox Pod Running, as a kubelet would once its container started."""
    while not stop.wait(0.05):
        for pod in kube_api.list_objects("v1", "Pod", "default", label_selector=SELECTOR):
            if (pod.get("status") or {}).get("phase") != "Running":
                kube_api.patch("v1", "Pod", pod["metadata"]["name"], {"status": {"phase": "Running"}}, "default",
                               subresource="status")


async def test_pod_is_deleted_when_its_rollout_fails(kube_api: Any) -> None:
    task = load_dir(TASKS)["sales-total"]
    prov = provider(kube_api)
    stop = threading.Event()
    kubelet = threading.Thread(target=play_kubelet, args=(kube_api, stop), daemon=True)
    kubelet.start()
    try:
        # Running, then the exec that copies the task in loses its connection: the sandbox is torn down.
        kube_api.emulator.pod_exec.drop_after_start = True
        with pytest.raises(SandboxError, match="exec"):
            await prov.open("rollout-2", task)
    finally:
        stop.set()
        kubelet.join(5)
    assert sandboxes(kube_api) == ([], []) and prov.open_sandboxes == {}


async def test_orphans_reaped_on_start_and_all_deleted_on_shutdown(kube_api: Any) -> None:
    crashed = provider(kube_api)  # an earlier runner of this pool that died mid-rollout
    orphans = [crashed.create("r-a"), crashed.create("r-b")]
    other = provider(kube_api, runner_id="runner-1").create("r-c")  # another runner's: must survive
    assert sandboxes(kube_api)[0] == sorted([*orphans, other])

    restarted = provider(kube_api)
    await restarted.start()
    assert sandboxes(kube_api) == ([other], [other])

    live = [await asyncio.to_thread(restarted.create, f"r-{i}") for i in range(2)]
    assert sandboxes(kube_api)[0] == sorted([*live, other])
    await restarted.shutdown()
    assert sandboxes(kube_api) == ([other], [other])


@pytest.fixture
def kubelet(kube_api: Any) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=play_kubelet, args=(kube_api, stop), daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(5)


@pytest.mark.usefixtures("kubelet")
async def test_a_rollout_runs_and_is_graded_through_exec(kube_api: Any) -> None:
    task = load_dir(TASKS)["sales-total"]
    prov = provider(kube_api)
    async with await prov.open("rollout-x", task) as sb:
        res = await sb.run(["sh", "-c", "head -1 sales.csv; echo to-stderr >&2; exit 3"], {"A": "1"}, 60)
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out) == (
            3, "order_id,customer,region,date,amount\n", "to-stderr\n", False)
        await sb.write_files({"/workspace/answer.txt": "5351\n", "/home/agent/.config/x.json": "{}"})
        assert await sb.read_file("/home/agent/.config/x.json") == "{}"
        assert await sb.read_file("/workspace/missing") is None
        # The harness plants a reward; the grader's own run replaces it with the real one.
        await sb.write_files({"/logs/verifier/reward.json": '{"reward": 1}'})
        graded = await sb.grade(task, 60)
        assert graded.grade is not None and graded.grade.reward == 1.0, graded
        await sb.write_files({"/workspace/answer.txt": "1\n"})
        assert (await sb.grade(task, 60)).grade.reward == 0.0  # type: ignore[union-attr]
        # A reward.txt the verifier cannot write (a directory) beside a planted reward.json: cleared first.
        await sb.run(["sh", "-c", "rm -rf /logs/verifier && mkdir -p /logs/verifier/reward.txt && "
                                  "echo '{\"reward\": 1}' > /logs/verifier/reward.json"], {}, 60)
        assert (await sb.grade(task, 60)).grade.reward == 0.0  # type: ignore[union-attr]
    assert sandboxes(kube_api) == ([], [])


@pytest.mark.usefixtures("kubelet")
async def test_exec_timeout_kills_the_command(kube_api: Any) -> None:
    prov = provider(kube_api)
    async with await prov.open("rollout-t", load_dir(TASKS)["sales-total"]) as sb:
        res = await sb.run(["sleep", "60"], {}, 2)
        assert res.timed_out and res.exit_code == 137 and res.duration_s < 30
        # The provider's own deadline, for a command whose `timeout` did not end it: the stream is abandoned.
        direct = await asyncio.to_thread(prov.exec, sb.name, ["sleep", "60"], 1.5)
        assert direct.timed_out and direct.exit_code == -1


@pytest.mark.usefixtures("kubelet")
async def test_a_harness_printing_without_end_costs_the_runner_only_its_output_tail(kube_api: Any) -> None:
    """The attack: a harness floods stdout (100 MB here). The runner keeps the tail of it, as the local sandbox
    does, not all of it: its peak memory (this process, the emulator included) stays flat (339 -> 342 MB here).
    Before, the exec kept every byte in the client's buffers and a list of its own, and read so slowly that the
    100 MB had not arrived when the 120 s limit killed the command (exit 137)."""
    prov = provider(kube_api)
    async with await prov.open("rollout-flood", load_dir(TASKS)["sales-total"]) as sb:
        before = peak_rss_mb(os.getpid())
        res = await sb.run(["sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' a; echo; echo END; "
                                        "head -c 10000000 /dev/zero | tr '\\0' b >&2; exit 4"], {}, 120)
        after = peak_rss_mb(os.getpid())
    assert (res.exit_code, res.timed_out) == (4, False)
    assert res.stdout.endswith("a\nEND\n") and len(res.stdout) == STDOUT_LIMIT
    assert res.stderr == "b" * STDERR_LIMIT
    assert after - before < 40, f"peak RSS {before:.0f} -> {after:.0f} MB"


@pytest.mark.usefixtures("kubelet")
async def test_a_dropped_exec_connection_is_a_sandbox_error_not_an_exit_code(kube_api: Any) -> None:
    prov = provider(kube_api)
    async with await prov.open("rollout-d", load_dir(TASKS)["sales-total"]) as sb:
        kube_api.emulator.pod_exec.drop_after_start = True
        with pytest.raises(SandboxError, match=r"exec in pod .*(connection|failed)"):
            await sb.run(["sleep", "5"], {}, 30)
        kube_api.emulator.pod_exec.drop_after_start = False


@pytest.mark.usefixtures("kubelet")
def test_emulated_exec_speaks_stdin_and_the_v4_protocol(kube_api: Any) -> None:
    from kubernetes import client as k8s
    from kubernetes.stream import stream

    prov = provider(kube_api)
    name = prov.create("rollout-s")
    prov.wait_running(name)
    core = k8s.CoreV1Api(kube_api.client())
    for protocol in ("v5.channel.k8s.io", "v4.channel.k8s.io"):
        ws = stream(core.connect_get_namespaced_pod_exec, name, "default", container="sandbox",
                    command=["sh", "-c", "read line; echo got:$line; echo e >&2; exit 7"], stdin=True, stdout=True,
                    stderr=True, tty=False, _preload_content=False, _request_timeout=30,
                    _headers={"sec-websocket-protocol": protocol})
        ws.write_stdin("hello\n")
        deadline = time.monotonic() + 30
        while ws.is_open() and time.monotonic() < deadline:
            ws.update(timeout=1)
        assert ws.subprotocol == protocol
        assert (ws.read_stdout(), ws.read_stderr(), ws.returncode) == ("got:hello\n", "e\n", 7)
        ws.close()
    prov.delete(name)


def test_the_grader_pod_is_the_rollout_pods_twin_without_network(kube_api: Any) -> None:
    kube_api.patch("v1", "Namespace", "default", {"metadata": {"labels": {pod_security.ENFORCE: "restricted"}}})
    prov = provider(kube_api)
    rollout = kube_api.get("v1", "Pod", prov.create("rollout-1"), "default")
    name = prov.create("rollout-1", grader=True)
    pod = kube_api.get("v1", "Pod", name, "default")
    assert pod["spec"] == rollout["spec"]
    # Named with the rollout Pod's prefix: the runner may exec into its grader as into its rollout Pod.
    sandbox_id = name.removeprefix(POOL_SANDBOX.name_prefix)
    assert name.startswith(POOL_SANDBOX.name_prefix) and sandbox_id != rollout["metadata"]["labels"]["harnessrl.io/sandbox"]
    assert pod["metadata"]["labels"] == {**rollout["metadata"]["labels"], "harnessrl.io/sandbox": sandbox_id}
    policy = kube_api.get("networking.k8s.io/v1", "NetworkPolicy", name, "default")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"team": "rl", "harnessrl.io/sandbox": sandbox_id}}  # its run's labels too
    assert (policy["ingress"], policy["egress"], policy["policyTypes"]) == ([], [], ["Ingress", "Egress"])
    prov.reap()
    assert sandboxes(kube_api) == ([], [])


@pytest.mark.usefixtures("kubelet")
async def test_a_harness_cannot_leave_anything_behind_that_the_grader_runs_with(kube_api: Any, tmp_path: Path) -> None:
    """The attack: the harness leaves a process that keeps planting a reward of 1 and a test.sh that writes one
    (tests/fixtures/left_behind.py), and a usercustomize.py in its HOME that makes every Python exit 0 at start.
    The task's grader is Harbor's common kind, a `python3` check without -I. Before, the grader ran in the rollout
    Pod with that HOME and a wrong answer scored 1.0 (the process itself was already gone: `kill -9 -1` after each
    command ends it, in the emulator's container as in a Pod); now it runs in a Pod of its own and scores 0, and
    that Pod is deleted when grading ends. What the emulator does not reproduce: the image (its container is this
    machine's system read-only, run as this test's user in bubblewrap), the runtime class, resource limits and the
    NetworkPolicy's enforcement."""
    shutil.copytree(TASKS / "train" / "sales-total", tmp_path / "harbor-style")
    (tmp_path / "harbor-style" / "tests" / "test.sh").write_text(
        '#!/usr/bin/env bash\nmkdir -p "$LOGS_DIR/verifier"\n'
        'if python3 -c \'import sys; sys.exit(open("answer.txt").read().strip() != "5351")\'; '
        'then echo 1; else echo 0; fi > "$LOGS_DIR/verifier/reward.txt"\n')
    task = load_dir(tmp_path)["harbor-style"]
    prov = provider(kube_api)
    async with await prov.open("rollout-left", task) as sb:
        await sb.write_files({"/workspace/answer.txt": "5351\n"})
        assert (await sb.grade(task, 60)).grade.reward == 1.0  # type: ignore[union-attr]
        await sb.write_files({"/workspace/answer.txt": "1\n"})
        plant = ("d=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$d\" && "
                 "echo 'import os; os._exit(0)' > \"$d/usercustomize.py\"")
        assert (await sb.run(["sh", "-c", plant], {}, 30)).exit_code == 0
        await sb.run(leave_walker(sb.home, sb.logs_dir, sb.tests_dir), {}, 30)
        graded = await sb.grade(task, 60)
        assert graded.grade is not None and graded.grade.reward == 0.0, graded
        assert sandboxes(kube_api)[0] == [sb.name]  # the grader's Pod is gone
    assert sandboxes(kube_api) == ([], [])


@pytest.mark.usefixtures("kubelet")
async def test_the_workspace_reaches_the_grader_pod_whole_and_only_up_to_its_limit(
    kube_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = load_dir(TASKS)["sales-total"]
    prov = provider(kube_api)
    async with await prov.open("rollout-big", task) as sb:
        # 600 KB that gzip cannot shrink: read out in three chunks, written in through stdin.
        make = "head -c 600000 /dev/urandom > blob && mkdir -p d && ln -s ../blob d/link && sha256sum blob"
        digest = (await sb.run(["sh", "-c", make], {}, 30)).stdout
        packed = await sb.pack(sb.workspace)
        assert packed is not None and len(packed) > 2 * kubernetes.CHUNK
        grader = await prov.open_grader("rollout-big")
        try:
            await grader.unpack(packed, grader.workspace)
            res = await grader.run(["sh", "-c", "sha256sum blob && readlink d/link && head -1 sales.csv"], {}, 30)
        finally:
            await grader.close()
        assert res.stdout == digest + "../blob\norder_id,customer,region,date,amount\n"
        monkeypatch.setattr(kubernetes, "WORKSPACE_LIMIT", 500_000)
        graded = await sb.grade(task, 60)
        assert graded.grade is None and "over the 500000 bytes a grader pod takes" in str(graded.error)
        assert sandboxes(kube_api)[0] == [sb.name]


RUNNER_TOKEN = "runner-service-account"


@pytest.fixture
def policed_api(tmp_path: Path) -> Iterator[Any]:
    """The emulator authorizing by RBAC and admitting by the chart's sandbox policy, holding what the chart and
    the operator render for run `run` (namespace default): the harnessrl-sandbox ClusterRole, the policy and its
    binding, the claude-code runners' RoleBinding; RUNNER_TOKEN is those runners' ServiceAccount."""
    chart = [d for d in render_chart({}) if d["kind"] in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
             or (d["kind"], d["metadata"]["name"]) == ("ClusterRole", "harnessrl-sandbox")]
    # Without their owner (no TrainingRun is stored here): what the policy reads is the binding's labels and subjects.
    bindings = [{**m, "metadata": {k: v for k, v in m["metadata"].items() if k != "ownerReferences"}}
                for m in children("default") if m["kind"] == "RoleBinding"]
    with running_emulator(tmp_path, {RUNNER_TOKEN: service_account("default", "run-claude-code-runner")}) as api:
        api.apply([*chart, *bindings])
        yield api


def policed_provider(api: Any) -> KubernetesProvider:
    """The claude-code runner's provider, with the config the operator renders, as the runner's ServiceAccount."""
    rendered = next(m for m in children("default") if m["metadata"]["name"] == "run-claude-code-runner-config")
    config = KubernetesSandboxConfig.model_validate(yaml.safe_load(rendered["data"]["config.yaml"])["sandbox"])
    return KubernetesProvider(config.model_copy(update={"pod_start_timeout_s": 30}), pool="claude-code",
                              runner_id="runner-0", api_client=api.client(RUNNER_TOKEN))


async def test_a_runner_grades_a_rollout_in_its_own_pods_under_the_sandbox_policy(policed_api: Any) -> None:
    """The kubernetes sandbox as the operator deploys it: the runner's own token, RBAC, and the chart's admission
    policy on every create, exec and delete. Its rollout and grader Pods are its own; it runs and grades."""
    stop = threading.Event()
    kubelet = threading.Thread(target=play_kubelet, args=(policed_api, stop), daemon=True)
    kubelet.start()
    try:
        prov = policed_provider(policed_api)
        async with await prov.open("rollout-p", load_dir(TASKS)["sales-total"]) as sb:
            assert sb.name.startswith("run.claude-code.")
            await sb.write_files({"/workspace/answer.txt": "5351\n"})
            graded = await sb.grade(load_dir(TASKS)["sales-total"], 60)
            assert graded.grade is not None and graded.grade.reward == 1.0, graded
        await prov.shutdown()
    finally:
        stop.set()
        kubelet.join(5)
    assert sandboxes(policed_api) == ([], [])
    grader_execs = [argv for argv in policed_api.emulator.pod_exec.started if "/tests/test.sh" in " ".join(argv)]
    assert grader_execs  # the grader Pod was exec'd into, by the runner


def test_a_runner_execs_into_no_pod_but_its_own_sandboxes(policed_api: Any) -> None:
    """The attack: a harness that broke out of its sandbox into the runner uses the runner's token to exec into the
    learner (the admin, runner and Hub tokens), the proxy, the engine, its own runner Pod, or another run's sandbox
    in the namespace. The exec is refused before anything runs."""
    workloads = {m["metadata"]["name"]: m for m in children("default") if m["kind"] in ("StatefulSet", "Deployment", "Job")}
    targets = {"run-learner-x2x4k": "run-learner", "run-proxy-0": "run-proxy", "run-engine-0": "run-engine",
               "run-claude-code-runner-5d8f7c9b4-q7w2e": "run-claude-code-runner"}
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
             "spec": workloads[workload]["spec"]["template"]["spec"]} for name, workload in targets.items()]
    other_run = policed_provider(policed_api).config.model_copy(update={"name_prefix": "other.claude-code."})
    other = kubernetes.pod_manifest(other_run, "other.claude-code.0123456789abcdef", {}, 600)
    policed_api.apply([*pods, other])  # as an administrator
    for pod in [*pods, other]:
        policed_api.patch("v1", "Pod", pod["metadata"]["name"], {"status": {"phase": "Running"}}, "default",
                          subresource="status")
    prov = policed_provider(policed_api)
    for pod in [*pods, other]:
        with pytest.raises(SandboxError, match="422") as refused:
            prov.exec(pod["metadata"]["name"], ["cat", "/var/run/secrets/harnessrl/admin-token"], 10)
        assert "only into its own run's and pool's sandbox Pods" in str(refused.value)
    assert policed_api.emulator.pod_exec.started == []
    # Nor can anyone plant a Pod under the runner's prefix for it to exec into.
    planted = copy.deepcopy(other)
    planted["metadata"]["name"] = "run.claude-code.0123456789abcdef"
    with pytest.raises(KubeApiError, match="only the run's runner creates Pods named as its sandboxes"):
        policed_api.apply(planted)
    # Its own sandbox: exec works.
    name = prov.create("rollout-own")
    policed_api.patch("v1", "Pod", name, {"status": {"phase": "Running"}}, "default", subresource="status")
    assert prov.exec(name, ["echo", "own"], 10).stdout == "own\n"
