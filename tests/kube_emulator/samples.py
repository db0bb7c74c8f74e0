"""A small CustomResourceDefinition that exercises what the emulator validates (used by its own tests)."""

from __future__ import annotations

import copy
from typing import Any

GROUP = "example.harnessrl.io"
PLURAL = "widgets"
KIND = "Widget"

_WIDGET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [
                {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must not exceed maxReplicas"},
                {"rule": "!has(oldSelf.model) || (has(self.model) && self.model == oldSelf.model)",
                 "message": "model is immutable", "reason": "FieldValueForbidden"},
                {"rule": "!(has(self.image) && has(self.command))",
                 "messageExpression": "'set image or command, not both (image: ' + self.image + ')'"},
            ],
            "properties": {
                "size": {"type": "integer", "minimum": 2, "maximum": 64},
                "model": {"type": "string", "minLength": 1, "maxLength": 20, "pattern": "^[a-z0-9-]*$"},
                "mode": {"type": "string", "enum": ["lora", "full"], "default": "lora"},
                "image": {"type": "string"},
                "command": {"type": "array", "items": {"type": "string"}},
                "tags": {"type": "array", "maxItems": 3, "items": {"type": "string"}},
                "labels": {"type": "object", "maxProperties": 2, "additionalProperties": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "minReplicas": {"type": "integer", "default": 1},
                "maxReplicas": {"type": "integer", "default": 4},
                "replicas": {"type": "integer", "minimum": 0},
                "limits": {"type": "object", "default": {},
                           "properties": {"cpu": {"type": "string", "default": "1"}}},
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string"},
                "replicas": {"type": "integer"},
                "observedGeneration": {"type": "integer"},
                "message": {"type": "string"},
            },
        },
    },
}


def widget_crd(versions: tuple[str, ...] = ("v1",)) -> dict[str, Any]:
    """The Widget CRD; the first version is the storage version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": KIND, "shortNames": ["wd"],
                      "categories": ["harnessrl"]},
            "versions": [
                {
                    "name": version, "served": True, "storage": n == 0,
                    "schema": {"openAPIV3Schema": copy.deepcopy(_WIDGET_SCHEMA)},
                    "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                             "statusReplicasPath": ".status.replicas"}},
                }
                for n, version in enumerate(versions)
            ],
        },
    }


def widget(name: str, namespace: str = "default", version: str = "v1", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{version}", "kind": KIND, "metadata": {"name": name, "namespace": namespace},
            "spec": {"size": 2, **spec}}
