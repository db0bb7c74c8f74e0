"""A tiny kopf operator (defined here) against the Kubernetes API emulator: kopf discovers the CRD, lists and
watches the custom resources, runs create/update/delete handlers, patches status, posts events and manages
its finalizer — all over HTTP, in KopfRunner's thread, as it would against a real cluster."""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes import client

from tests.fixtures.kube import KubeApi
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


def test_kopf_operator_reacts_and_patches_status(kube_api: KubeApi) -> None:
    kube_api.apply(widget_crd())
    deleted: list[str] = []
    with kube_api.kopf_runner(_operator(deleted), namespace="default") as runner:
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
