"""A rendered Pod → `podman run` (checks/podspec.py, what `make cluster-check` starts): on the quickstart's own
children, each field a kubelet honours maps to the option that does the same, and what it cannot map is refused."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from harnessrl.operator.plan.types import Images

from checks import podspec
from checks.cluster import pods, rendered

ROOT = Path(__file__).resolve().parents[2]
CHILDREN = rendered(ROOT / "examples/quickstart/trainingrun.yaml", Images(registry="localhost/harnessrl", tag="t"))
TEMPLATES = {name: template for name, template, _ in pods(CHILDREN)}
SECRETS = {m["metadata"]["name"]: podspec.secret_data(m) for m in CHILDREN if m["kind"] == "Secret"}
CONFIG_MAPS = {m["metadata"]["name"]: m["data"] for m in CHILDREN if m["kind"] == "ConfigMap"}


def ctx(name: str) -> podspec.PodContext:
    return podspec.PodContext(name=name, namespace="default", ip="10.89.7.10", config_maps=CONFIG_MAPS,
                              secrets=SECRETS)


def argv(pod: str, **kw: Any) -> list[str]:
    spec = TEMPLATES[pod]["spec"]
    dirs = {v["name"]: f"/w/{v['name']}" for v in spec["volumes"]}
    return podspec.run_argv(spec, spec["containers"][0], ctx(pod), name="c", network="n", volume_dirs=dirs,
                            hosts={"quickstart-proxy": "10.89.7.100"}, **kw)


def test_every_workload_of_the_quickstart_is_a_pod() -> None:
    assert set(TEMPLATES) == {"quickstart-engine-0", "quickstart-proxy-0", "quickstart-learner-check",
                              "quickstart-oneshot-runner-check"}


def test_the_proxy_runs_as_rendered() -> None:
    spec = TEMPLATES["quickstart-proxy-0"]["spec"]
    out = argv("quickstart-proxy-0")
    pairs = set(itertools.pairwise(out))
    assert {("--user", "10001:10001"), ("--group-add", "10001"), ("--cap-drop", "ALL"), ("--ip", "10.89.7.10"),
            ("--security-opt", "no-new-privileges"), ("--hostname", "quickstart-proxy-0"),
            ("--add-host", "quickstart-proxy:10.89.7.100"), ("--env", "POD_NAME=quickstart-proxy-0"),
            ("--volume", "/w/config:/etc/harnessrl:ro"), ("--volume", "/w/tmp:/tmp:rw")} <= pairs
    # A read-only root without podman's own tmpfs on /tmp: only the Pod's emptyDir makes /tmp writable.
    assert "--read-only" in out and "--read-only-tmpfs=false" in out
    assert json.loads(out[out.index("--entrypoint") + 1]) == spec["containers"][0]["command"]
    assert out[-1] == "localhost/harnessrl/proxy:t"


def test_a_second_container_joins_the_first_ones_network() -> None:
    out = argv("quickstart-proxy-0", join="first")
    assert ("--network", "container:first") in set(itertools.pairwise(out))
    assert "--ip" not in out and "--add-host" not in out and "--hostname" not in out


def test_secret_files_keep_their_mode_and_env_resolves_the_pod_ip() -> None:
    volumes = {v.name: v for v in podspec.volumes(TEMPLATES["quickstart-proxy-0"]["spec"], ctx("p"))}
    token = volumes["secret-0"].files
    assert [(f.path, f.mode) for f in token] == [("token", 0o440)]
    assert token[0].content == SECRETS["quickstart-proxy-admin"]["token"]
    assert volumes["tmp"] == podspec.Volume(name="tmp")
    learner = TEMPLATES["quickstart-learner-check"]["spec"]["containers"][0]
    assert podspec.env(learner, ctx("l"))["POD_IP"] == "10.89.7.10"


def test_env_from_a_secret_key_and_the_unmapped_refused() -> None:
    container = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "quickstart-runner-token",
                                                                        "key": "token"}}}]}
    assert podspec.env(container, ctx("p")) == {"T": SECRETS["quickstart-runner-token"]["token"].decode()}
    with pytest.raises(podspec.UnsupportedSpec, match=r"spec\.nodeName"):
        podspec.env({"env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}, ctx("p"))
    with pytest.raises(podspec.UnsupportedSpec, match="hostPath"):
        podspec.volumes({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, ctx("p"))


def test_probes_and_services_follow_named_ports() -> None:
    proxy = TEMPLATES["quickstart-proxy-0"]["spec"]
    assert podspec.probe_url(proxy["containers"][0], "10.0.0.1") == "http://10.0.0.1:8080/healthz"
    runner = TEMPLATES["quickstart-oneshot-runner-check"]["spec"]["containers"][0]
    assert podspec.probe_url(runner, "10.0.0.1") is None
    svc = next(m for m in CHILDREN if m["kind"] == "Service" and m["metadata"]["name"] == "quickstart-proxy")
    assert podspec.service_target(svc, proxy, svc["spec"]["ports"][0]) == 8080
    assert podspec.selects(svc["spec"]["selector"], TEMPLATES["quickstart-proxy-0"]["metadata"]["labels"])
    assert not podspec.selects(svc["spec"]["selector"],
                               TEMPLATES["quickstart-oneshot-runner-check"]["metadata"]["labels"])
