"""Pure parts of the Kubernetes API emulator: schema pruning/defaulting/validation, CEL rules, patches,
selectors and path routing (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kube_emulator.cel_rules import CelRule, evaluate_rule
from tests.kube_emulator.patching import json_patch, merge_patch, strategic_merge_patch
from tests.kube_emulator.routing import parse_path
from tests.kube_emulator.schema import prune_and_default, validate
from tests.kube_emulator.selectors import field_matcher, label_matcher, selector_string
from tests.kube_emulator.values import MISSING


def _messages(schema: dict[str, Any], value: Any, old: Any = MISSING) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in validate(schema, value, "spec", old)]


def test_int_or_string_nullable_and_list_types() -> None:
    schema = {"type": "object", "properties": {
        "port": {"x-kubernetes-int-or-string": True},
        "note": {"type": "string", "nullable": True},
        "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
        "pools": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                  "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
    }}
    assert _messages(schema, {"port": "http", "note": None, "tags": ["a"], "pools": [{"name": "a"}]}) == []
    assert _messages(schema, {"port": 1.5}) == [
        'spec.port: Invalid value: "number": spec.port in body must be of type integer or string: "number"']
    assert _messages(schema, {"tags": ["a", "a"]}) == ['spec.tags[1]: Duplicate value: "a"']
    assert _messages(schema, {"pools": [{"name": "a"}, {"name": "a"}]})[0].startswith("spec.pools[1]: Duplicate value")


def test_pruning_keeps_metadata_and_drops_non_nullable_nulls_before_defaulting() -> None:
    schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": {
        "mode": {"type": "string", "default": "lora"}, "items": {"type": "array", "items": {
            "type": "object", "properties": {"w": {"type": "integer", "default": 1}}}}}}}}
    obj = {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "labels": {"k": "v"}},
           "spec": {"mode": None, "items": [{"junk": 1}]}, "junk": True}
    assert prune_and_default(schema, obj, root=True) == {
        "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a", "labels": {"k": "v"}},
        "spec": {"mode": "lora", "items": [{"w": 1}]}}


def test_one_of_any_of_and_exclusive_bounds() -> None:
    schema = {"type": "object", "properties": {
        "lr": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        "src": {"type": "object", "oneOf": [{"required": ["hub"]}, {"required": ["pvc"]}],
                "properties": {"hub": {"type": "string"}, "pvc": {"type": "string"}}},
    }}
    assert _messages(schema, {"lr": 0.001, "src": {"hub": "x"}}) == []
    assert _messages(schema, {"lr": 0}) == ["spec.lr: Invalid value: 0: spec.lr in body should be greater than 0"]
    assert "must validate one and only one schema (oneOf)" in _messages(schema, {"src": {"hub": "x", "pvc": "y"}})[0]


@pytest.mark.parametrize(("rule", "value", "old", "expected"), [
    ({"rule": "self.a <= self.b"}, {"a": 1, "b": 2}, MISSING, None),
    ({"rule": "self.a <= self.b"}, {"a": 3, "b": 2}, MISSING, 'spec: Invalid value: "object": failed rule: self.a <= self.b'),
    ({"rule": "self == oldSelf", "message": "immutable"}, "x", MISSING, None),  # transition rules skip creates
    ({"rule": "self == oldSelf", "message": "immutable"}, "y", "x", 'spec: Invalid value: "y": immutable'),
    ({"rule": "size(self) <= 2", "messageExpression": "'too many: ' + string(size(self))"}, [1, 2, 3], MISSING,
     'spec: Invalid value: "array": too many: 3'),
    ({"rule": "has(self.x)", "reason": "FieldValueRequired", "fieldPath": ".x", "message": "x is required"}, {}, MISSING,
     "spec.x: Required value: x is required"),
    ({"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": True, "message": "may not shrink"},
     1, MISSING, None),
    ({"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "optionalOldSelf": True, "message": "may not shrink"},
     1, 2, "spec: Invalid value: 1: may not shrink"),
    ({"rule": "self.image != ''"}, {}, MISSING,
     "spec: Invalid value: \"object\": no such key: image evaluating rule: self.image != ''"),
    ({"rule": "self.all(p, p.name.lowerAscii() == p.name)"}, [{"name": "ok"}], MISSING, None),
    ({"rule": "self.map(h, h.weight).sum() == 100", "message": "weights must add up to 100"},
     [{"weight": 60}, {"weight": 30}], MISSING, 'spec: Invalid value: "array": weights must add up to 100'),
])
def test_cel_rules(rule: dict[str, Any], value: Any, old: Any, expected: str | None) -> None:
    cause = evaluate_rule(CelRule.model_validate(rule), value, old, "spec")
    assert (None if cause is None else f"{cause['field']}: {cause['message']}") == expected


def test_patches() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {"a": {"c": 2, "d": 3}, "l": [2]}
    assert json_patch({"a": [1]}, [{"op": "add", "path": "/a/-", "value": 2}]) == {"a": [1, 2]}
    with pytest.raises(Exception, match="test"):
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    original = {"metadata": {"finalizers": ["a"]}, "spec": {"ports": [{"port": 80, "name": "http"}],
                                                           "containers": [{"name": "m", "env": [{"name": "A", "value": "1"}]}]}}
    patched = strategic_merge_patch(original, {"metadata": {"finalizers": ["b"]}, "spec": {
        "ports": [{"port": 443, "name": "https"}], "containers": [{"name": "m", "env": [{"name": "B", "value": "2"}]}]}})
    assert patched["metadata"]["finalizers"] == ["a", "b"]
    assert [p["port"] for p in patched["spec"]["ports"]] == [80, 443]
    assert [e["name"] for e in patched["spec"]["containers"][0]["env"]] == ["A", "B"]


def test_selectors() -> None:
    obj = {"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "x", "tier": "web"}}}
    assert label_matcher("app=x,tier in (web, db),!gone")(obj)
    assert not label_matcher("app notin (x)")(obj)
    assert field_matcher("metadata.name=a,metadata.namespace!=other")(obj)
    assert selector_string({"matchLabels": {"b": "2", "a": "1"},
                            "matchExpressions": [{"key": "c", "operator": "In", "values": ["x", "y"]}]}) == "a=1,b=2,c in (x,y)"


def test_routing_understands_namespace_paths_that_kmock_misreads() -> None:
    assert parse_path("/api/v1/namespaces").plural == "namespaces"
    ns = parse_path("/api/v1/namespaces/team")
    assert (ns.plural, ns.name, ns.namespace) == ("namespaces", "team", None)
    status = parse_path("/api/v1/namespaces/team/status")
    assert (status.plural, status.name, status.subresource) == ("namespaces", "team", "status")
    pod = parse_path("/api/v1/namespaces/team/pods/p/status")
    assert (pod.namespace, pod.plural, pod.name, pod.subresource) == ("team", "pods", "p", "status")
    crd = parse_path("/apis/harnessrl.io/v1alpha1/trainingruns")
    assert (crd.group, crd.version, crd.plural, crd.namespace) == ("harnessrl.io", "v1alpha1", "trainingruns", None)
    assert parse_path("/apis/apps").kind == "group"
