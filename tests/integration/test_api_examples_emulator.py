"""The CRDs and examples against the Kubernetes API emulator, through the official `kubernetes` client.

The emulator (tests/kube_emulator, the `kube_api` fixture) is not a real API server: it is kmock plus a
shim that serves a CRD's resource once the CRD is created and prunes, defaults and validates custom
resources with the CRD's openAPIV3Schema and CEL rules (evaluated by the `common-expression-language`
package), answering 422 with the API server's wording. So these tests show that the generated CRDs
accept every example and reject every invalid one with the message written in its `# expect:` header;
they cannot show CEL cost-budget checks or other admission a real server adds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harnessrl.operator.api import GROUP, VERSION, load_manifest

ROOT = Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
VALID = [ROOT / "examples" / "trainingrun.yaml", *sorted((ROOT / "examples" / "harnesspools").glob("*.yaml")),
         *sorted((ROOT / "examples" / "enginepools").glob("*.yaml"))]
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))
NAMESPACE = "default"
PLURALS = {"TrainingRun": "trainingruns", "HarnessPool": "harnesspools", "EnginePool": "enginepools"}


def header(path: Path, name: str) -> str | None:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {name}:"):
            return line.removeprefix(f"# {name}:").strip()
    return None


def expectation(path: Path) -> str:
    """The `# expect: ...` header of an invalid example: part of the message the API server gives."""
    expected = header(path, "expect")
    assert expected, f"{path} has no '# expect:' header"
    return expected


def expected_status(path: Path) -> int:
    """422 Invalid, or what `# expect-status:` says (400 for bodies the server cannot decode)."""
    return int(header(path, "expect-status") or 422)


@pytest.fixture
def api(kube_api: Any) -> Iterator[Any]:
    """A CustomObjectsApi on an emulator serving the two CRDs, created with ApiextensionsV1Api."""
    import kubernetes.client

    client = kube_api.client()
    extensions = kubernetes.client.ApiextensionsV1Api(client)
    for path in CRDS:
        extensions.create_custom_resource_definition(yaml.safe_load(path.read_text()))
    try:
        yield kubernetes.client.CustomObjectsApi(client)
    finally:
        client.close()


def create(api: Any, manifest: dict[str, Any], **options: Any) -> dict[str, Any]:
    body: dict[str, Any] = api.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURALS[manifest["kind"]], manifest, **options
    )
    return body


def test_crds_are_served(kube_api: Any, api: Any) -> None:
    import kubernetes.client

    extensions = kubernetes.client.ApiextensionsV1Api(kube_api.client())
    names = {crd.metadata.name for crd in extensions.list_custom_resource_definition().items}
    assert names == {f"trainingruns.{GROUP}", f"harnesspools.{GROUP}", f"enginepools.{GROUP}"}
    assert api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainingruns")["items"] == []


def _filled(value: Any) -> Any:
    """`value` without nulls and empty collections: what neither side's defaults add."""
    if isinstance(value, dict):
        kept = {k: _filled(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_filled(v) for v in value]
    return value


# One emulator for all examples of a kind of check: serving the CRDs costs about a second per emulator.
def test_every_example_is_accepted_and_defaulted_like_the_model(api: Any) -> None:
    for path in VALID:
        manifest = yaml.safe_load(path.read_text())
        stored = create(api, manifest)
        # The server filled in the CRD's defaults; they are exactly the model's defaults, field by field.
        model_spec = load_manifest(manifest).spec.model_dump(mode="json")
        assert _filled(stored["spec"]) == _filled(model_spec), path.name
        assert len(json.dumps(stored["spec"])) > len(json.dumps(manifest["spec"])), (
            path.name
        )  # defaults added


def test_every_invalid_example_is_rejected_with_its_message(api: Any) -> None:
    import kubernetes.client

    wrong = []
    for path in INVALID:
        try:  # as kubectl sends it: unknown fields are errors
            create(api, yaml.safe_load(path.read_text()), field_validation="Strict")
        except kubernetes.client.ApiException as error:
            message = json.loads(error.body)["message"]
            if error.status != expected_status(path) or expectation(path) not in message:
                wrong.append(f"{path.name}: {error.status} {message}")
        else:
            wrong.append(f"{path.name}: accepted")
    assert not wrong, "\n".join(wrong)
    assert len(INVALID) >= 60


def test_base_model_is_immutable(api: Any) -> None:
    import kubernetes.client

    run = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    name = run["metadata"]["name"]
    create(api, run)
    patched = api.patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, "trainingruns", name, {"spec": {"grpo": {"steps": 800}}}
    )
    assert patched["spec"]["grpo"]["steps"] == 800
    with pytest.raises(kubernetes.client.ApiException) as caught:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "trainingruns", name,
            {"spec": {"model": {"base": {"hub": {"repo": "Qwen/Qwen3-32B"}}}}},
        )  # fmt: skip
    assert caught.value.status == 422
    assert "model.base is immutable" in json.loads(caught.value.body)["message"]


@pytest.mark.parametrize("field", ["replicas", "workers"])
def test_proxy_replicas_and_workers_are_immutable(api: Any, field: str) -> None:
    """Each replica (and each worker of one) owns its sessions and journal, and the learner sets the policy on
    the replicas the run started with."""
    import kubernetes.client

    run = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    run["metadata"]["name"] += f"-{field}"
    run["spec"].setdefault("proxy", {})[field] = 2
    create(api, run)
    with pytest.raises(kubernetes.client.ApiException) as caught:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, "trainingruns", run["metadata"]["name"], {"spec": {"proxy": {field: 3}}}
        )
    assert caught.value.status == 422
    assert f"proxy.{field} is immutable" in json.loads(caught.value.body)["message"]


def test_status_subresource_takes_conditions(api: Any) -> None:
    run = yaml.safe_load((ROOT / "examples" / "trainingrun.yaml").read_text())
    name = run["metadata"]["name"]
    create(api, run)
    status = {
        "phase": "Running",
        "step": 3,
        "passAt1": {"claude-code": 0.25},
        "conditions": [
            {
                "type": "Training",
                "status": "True",
                "reason": "Stepping",
                "lastTransitionTime": "2026-11-30T00:00:00Z",
            }
        ],
    }
    stored = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, "trainingruns", name, {"status": status}
    )
    assert stored["status"]["conditions"][0]["observedGeneration"] == 0  # defaulted by the schema
    assert load_manifest(stored).status.pass_at1 == {"claude-code": 0.25}


def test_scale_subresource_moves_spec_replicas(api: Any) -> None:
    pool = yaml.safe_load((ROOT / "examples" / "harnesspools" / "codex.yaml").read_text())
    create(api, pool)
    api.patch_namespaced_custom_object_scale(
        GROUP, VERSION, NAMESPACE, "harnesspools", "codex", {"spec": {"replicas": 5}}
    )
    stored = api.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "harnesspools", "codex")
    assert stored["spec"]["replicas"] == 5
