"""A tiny kopf operator (defined here) against the Kubernetes API emulator: kopf discovers the CRD, lists and
watches the custom resources, runs create/update/delete handlers, patches status, posts events and manages
its finalizer — all over HTTP, in KopfRunner's thread, as it would against a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
from kubernetes import client

from tests.fixtures.kube import KubeApi
from tests.kube_emulator import KubeEmulator
from tests.kube_emulator.samples import GROUP, KIND, PLURAL, widget, widget_crd


def _operator(deleted: list[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.create(GROUP, "v1", PLURAL, registry=registry)
    def created(body: kopf.Body, spec: dict[str, Any], patch: kopf.Patch, **_: Any) -> None:
        patch.status["phase"] = "Created"
        patch.status["replicas"] = spec["size"]
        kopf.info(body, reason="Created", message="widget created")  # POSTs a core/v1 Event

    @kopf.on.update(GROUP, "v1", PLURAL, field="spec.size", registry=registry)
    def resized(new: int, meta: dict[str, Any], patch: kopf.Patch, **_: Any) -> None:
        patch.status["phase"] = "Resized"
        patch.status["replicas"] = new
        patch.status["observedGeneration"] = meta["generation"]

    @kopf.on.delete(GROUP, "v1", PLURAL, registry=registry)
    def removed(name: str, **_: Any) -> None:
        deleted.append(name)

    return registry


@pytest.mark.parametrize("namespace", ["default", None], ids=["namespaced", "all-namespaces"])
def test_kopf_operator_reacts_and_patches_status(kube_api: KubeApi, namespace: str | None) -> None:
    kube_api.apply(widget_crd())
    deleted: list[str] = []
    with kube_api.kopf_runner(_operator(deleted), namespace=namespace) as runner:
        kube_api.apply(widget("w1", size=3))

        def status() -> dict[str, Any]:
            obj = kube_api.get(f"{GROUP}/v1", KIND, "w1", "default") or {}
            found: dict[str, Any] = obj.get("status") or {}
            return found

        assert kube_api.wait_for(lambda: status().get("phase") == "Created", timeout=20)
        assert status()["replicas"] == 3
        obj = kube_api.get(f"{GROUP}/v1", KIND, "w1", "default")
        assert obj is not None and "kopf.zalando.org/KopfFinalizerMarker" in obj["metadata"]["finalizers"]

        kube_api.patch(f"{GROUP}/v1", KIND, "w1", {"spec": {"size": 5}}, "default")
        assert kube_api.wait_for(lambda: status().get("phase") == "Resized", timeout=20)
        assert status()["replicas"] == 5 and status()["observedGeneration"] == 2

        events = client.CoreV1Api(kube_api.client()).list_namespaced_event(
            "default", field_selector="involvedObject.name=w1").items
        assert "widget created" in [e.message for e in events]

        kube_api.delete(f"{GROUP}/v1", KIND, "w1", "default")
        assert kube_api.wait_for(lambda: kube_api.get(f"{GROUP}/v1", KIND, "w1", "default") is None, timeout=20)
        assert deleted == ["w1"]
    assert runner.exception is None


def test_kopf_survives_a_410_gone_after_its_watch_ends(kube_api: KubeApi) -> None:
    """kopf resumes a closed watch from its last resourceVersion; once that is compacted away the emulator
    answers 410 Gone (an ERROR event) and kopf must list again: it then still handles new objects."""
    kube_api.apply(widget_crd())

    def phase(name: str) -> str | None:
        obj = kube_api.get(f"{GROUP}/v1", KIND, name, "default") or {}
        found: str | None = (obj.get("status") or {}).get("phase")
        return found

    def restart_after_a_missed_change(emulator: KubeEmulator) -> None:
        # Atomically, so kopf cannot reconnect in between: its last-seen resourceVersion is now compacted away.
        emulator.close_watches()
        emulator.store.create(emulator.store.resource_type(GROUP, "v1", PLURAL), "default", widget("w2"))
        emulator.store.compact()

    with kube_api.kopf_runner(_operator([]), namespace="default"):
        kube_api.apply(widget("w1"))
        assert kube_api.wait_for(lambda: phase("w1") == "Created", timeout=20)
        kube_api.wait_for(lambda: any(r.params.get("watch") for r in kube_api.emulator._requests), timeout=20)
        kube_api.call(restart_after_a_missed_change)
        assert kube_api.wait_for(lambda: phase("w2") == "Created", timeout=20)
    requests = [r for r in kube_api.emulator._requests if r.url.path.endswith(f"/{PLURAL}") and r.method == "GET"]
    resumed = [r for r in requests if r.params.get("watch") == "true" and r.params.get("resourceVersion")]
    lists = [r for r in requests if "watch" not in r.params]
    assert len(resumed) >= 2  # kopf resumed its watch after the stream ended ...
    assert len(lists) >= 2  # ... was told 410 Gone, and listed again


_SUBPROCESS_OPERATOR = '''
import kopf

@kopf.on.create("v1", "configmaps")
def seen(patch, **_):
    patch.metadata["labels"] = {"seen-by": "subprocess"}
'''


def test_kopf_as_a_subprocess_logs_in_with_the_kubeconfig(kube_api: KubeApi, tmp_path: Path) -> None:
    """An operator started as its own process finds the emulator through KUBECONFIG (kopf's default login)."""
    module = tmp_path / "operator.py"
    module.write_text(_SUBPROCESS_OPERATOR)
    env = {**os.environ, "KUBECONFIG": str(kube_api.kubeconfig_path)}
    kopf_cli = Path(sys.executable).with_name("kopf")
    process = subprocess.Popen([str(kopf_cli), "run", "--standalone", "--namespace", "default", str(module)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        kube_api.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}})

        def labels() -> dict[str, str]:
            found: dict[str, str] = ((kube_api.get("v1", "ConfigMap", "cm", "default") or {}).get("metadata") or {}).get("labels") or {}
            return found

        assert kube_api.wait_for(lambda: labels().get("seen-by") == "subprocess", timeout=30)
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0].decode()
    assert "login_via_client' succeeded" in output
