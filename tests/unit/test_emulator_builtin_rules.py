"""The emulator's validation of built-in kinds against the API server's answers.

Each expected text is written as a Kubernetes 1.33 API server prints it; the comment names the function the
text comes from (k8s.io/kubernetes pkg/apis/core/validation/validation.go unless said otherwise), so a reader
can check it against the source."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from tests.kube_emulator.builtin_rules import semantic_causes
from tests.kube_emulator.builtin_schema import DecodeError, decode
from tests.kube_emulator.go_text import go_regexp
from tests.kube_emulator.quantity import QuantityError, parse

STS_KEY = ("apps", "statefulsets")
_DNS_SUBDOMAIN_TAIL = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                       "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                       r"validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_QUALIFIED_TAIL = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
                   "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
                   "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def statefulset(**pod: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", **pod.pop("container", {})}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x", "labels": {"app": "x"}},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "x",
                     "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [container], **pod}}}}


def messages(obj: dict[str, Any], key: tuple[str, str] = STS_KEY) -> list[str]:
    return [f"{c['field']}: {c['message']}" for c in semantic_causes(key, obj)]


P = "spec.template.spec"


@pytest.mark.parametrize(("pod", "expected"), [
    # ValidateResourceRequirements: requests above limits; the path names the whole requests map.
    ({"container": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}},
     f'{P}.containers[0].resources.requests: Invalid value: "2": must be less than or equal to cpu limit of 1'),
    # ... compared by value: 1500m > 1, printed in canonical form.
    ({"container": {"resources": {"requests": {"cpu": 1.5}, "limits": {"cpu": "1000m"}}}},
     f'{P}.containers[0].resources.requests: Invalid value: "1500m": must be less than or equal to cpu limit of 1'),
    ({"container": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1536Mi"}}}},
     f'{P}.containers[0].resources.requests: Invalid value: "2Gi": must be less than or equal to memory limit of 1536Mi'),
    # ValidateResourceQuantityValue -> ValidateNonnegativeQuantity (isNegativeErrorMsg).
    ({"container": {"resources": {"limits": {"memory": "-1Gi"}}}},
     f'{P}.containers[0].resources.limits[memory]: Invalid value: "-1Gi": must be greater than or equal to 0'),
    # Extended resources: not overcommitable (requests == limits) and integral (isNotIntegerErrorMsg).
    ({"container": {"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}}},
     f'{P}.containers[0].resources.requests: Invalid value: "1": must be equal to nvidia.com/gpu limit of 2'),
    ({"container": {"resources": {"limits": {"nvidia.com/gpu": "500m"}}}},
     f'{P}.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer'),
    # validateResourceName then validateContainerResourceName: an unqualified name must be a standard resource.
    ({"container": {"resources": {"limits": {"gpu": 1}}}},
     [f'{P}.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource type or fully qualified',
      f'{P}.containers[0].resources.limits[gpu]: Invalid value: "gpu": must be a standard resource for containers']),
    # ValidateTolerations: Exists with a value (the bad value is the value, since 1.32).
    ({"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]},
     f'{P}.tolerations[0].operator: Invalid value: "yes": value must be empty when `operator` is \'Exists\''),
    # ValidateTolerations: tolerationSeconds needs effect NoExecute.
    ({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     f'{P}.tolerations[0].effect: Invalid value: "NoSchedule": effect must be \'NoExecute\' when `tolerationSeconds` is set'),
    # ValidateTolerations: an empty key only with Exists.
    ({"tolerations": [{"operator": "Equal", "value": "a"}]},
     f'{P}.tolerations[0].operator: Invalid value: "Equal": operator must be Exists when `key` is empty, '
     'which means "match all values and all keys"'),
    # ValidateTolerations -> ValidateLabelName(key) -> IsQualifiedName.
    ({"tolerations": [{"key": "bad key", "operator": "Exists"}]},
     f'{P}.tolerations[0].key: Invalid value: "bad key": {_QUALIFIED_TAIL}'),
    # ValidatePodSpec: nodeSelector through ValidateLabels (the path names the map).
    ({"nodeSelector": {"-bad": "x"}}, f'{P}.nodeSelector: Invalid value: "-bad": {_QUALIFIED_TAIL}'),
    # ValidateRuntimeClassName -> NameIsDNSSubdomain.
    ({"runtimeClassName": "gVisor"}, f'{P}.runtimeClassName: Invalid value: "gVisor": {_DNS_SUBDOMAIN_TAIL}'),
    ({"priorityClassName": "High_Priority"}, f'{P}.priorityClassName: Invalid value: "High_Priority": {_DNS_SUBDOMAIN_TAIL}'),
    # validateContainers: the name is a DNS-1123 label.
    ({"container": {"name": "Main"}},
     f'{P}.containers[0].name: Invalid value: "Main": a lowercase RFC 1123 label must consist of lower case '
     "alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or "
     "'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
    # validateEnv with RelaxedEnvironmentVariableValidation (beta, on by default in 1.32 and 1.33).
    ({"container": {"env": [{"name": "A=B", "value": "1"}]}},
     f'{P}.containers[0].env[0].name: Invalid value: "A=B": a valid environment variable name must consist only of '
     "printable ASCII characters other than '='"),
])
def test_pod_spec_rules_read_as_the_api_server_words_them(pod: dict[str, Any], expected: str | list[str]) -> None:
    assert messages(statefulset(**pod)) == (expected if isinstance(expected, list) else [expected])


def test_selector_must_match_the_template_labels() -> None:
    # apps/validation ValidatePodTemplateSpecForStatefulSet; the labels print as Go's %#v of a map.
    sts = statefulset()
    sts["spec"]["template"]["metadata"]["labels"] = {"app": "x", "tier": "gpu", "z": "1"}
    assert messages(sts) == []
    sts["spec"]["template"]["metadata"]["labels"] = {"app": "y"}
    assert messages(sts) == ['spec.template.metadata.labels: Invalid value: map[string]string{"app":"y"}: '
                             '`selector` does not match template `labels`']
    sts["spec"]["selector"] = {}
    assert messages(sts)[0].endswith(": empty selector is invalid for statefulset")
    deployment = {**statefulset(), "kind": "Deployment"}
    deployment["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["z"]}]}
    assert messages(deployment, ("apps", "deployments"))[0].endswith("`selector` does not match template `labels`")


def test_label_and_annotation_syntax_on_every_object() -> None:
    # metav1 validation ValidateLabels / apimachinery ValidateAnnotations (keys lowercased before the check).
    sts = statefulset()
    sts["metadata"]["labels"] = {"app": "x", "ok": "-bad-"}
    sts["metadata"]["annotations"] = {"Example.com/Note": "fine", "a/b/c": "x"}
    assert messages(sts) == [
        'metadata.labels: Invalid value: "-bad-": a valid label must be an empty string or consist of alphanumeric '
        "characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
        "'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        'metadata.annotations: Invalid value: "a/b/c": a qualified name must consist of alphanumeric characters, '
        "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
        "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
        "subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    long_value = statefulset()
    long_value["metadata"]["labels"]["app"] = "x" * 64
    assert messages(long_value)[0] == f'metadata.labels: Invalid value: "{"x" * 64}": must be no more than 63 characters'


def test_job_needs_a_restart_policy_and_configmap_keys_are_checked() -> None:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Always"}}}}
    assert messages(job, ("batch", "jobs")) == [
        'spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"']
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a b": "1"}}
    assert messages(config, ("", "configmaps")) == [
        'data[a b]: Invalid value: "a b": a valid config key must consist of alphanumeric characters, \'-\', \'_\' '
        "or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"]


def test_configmaps_and_secrets_hold_at_most_one_mib_of_values() -> None:
    """ValidateConfigMap/ValidateSecret: values (base64 ones decoded) add up to at most 1 MiB; the ConfigMap's
    refusal is on the whole object (the empty path, printed `[]`), the Secret's on its data."""
    half = "x" * (512 * 1024)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": half, "b": half}}
    assert messages(config, ("", "configmaps")) == []  # exactly 1 MiB
    config["binaryData"] = {"c": base64.b64encode(b"y").decode()}
    assert messages(config, ("", "configmaps")) == ["[]: Too long: may not be more than 1048576 bytes"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
              "data": {"a": base64.b64encode(half.encode()).decode(), "b": base64.b64encode(half.encode()).decode()}}
    assert messages(secret, ("", "secrets")) == []
    secret["stringData"] = {"c": "z"}
    assert messages(secret, ("", "secrets")) == ["data: Too long: may not be more than 1048576 bytes"]


@pytest.mark.parametrize(("mutate", "expected"), [
    # Go's encoding/json UnmarshalTypeError: the innermost struct and the JSON path without indices or map keys.
    (lambda s: s["spec"].update(replicas="2"),
     "json: cannot unmarshal string into Go struct field StatefulSetSpec.spec.replicas of type int32"),
    (lambda s: s["spec"].update(replicas=2.5),
     "json: cannot unmarshal number 2.5 into Go struct field StatefulSetSpec.spec.replicas of type int32"),
    (lambda s: s["metadata"]["labels"].update(app=1),
     "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"),
    # A free-form affinity that is not an Affinity.
    (lambda s: s["spec"]["template"]["spec"].update(affinity={"nodeAffinity": ["x"]}),
     "json: cannot unmarshal array into Go struct field Affinity.spec.template.spec.affinity.nodeAffinity of type v1.NodeAffinity"),
    # resource.ParseQuantity's ErrFormatWrong.
    (lambda s: s["spec"]["template"]["spec"]["containers"][0].update(resources={"limits": {"cpu": "1 core"}}),
     "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
])
def test_values_of_the_wrong_type_are_decode_errors(mutate: Any, expected: str) -> None:
    sts = statefulset()
    mutate(sts)
    with pytest.raises(DecodeError) as caught:
        decode("apps/v1", "StatefulSet", sts)
    assert str(caught.value) == expected


def test_unknown_fields_are_dropped_and_named_with_their_index() -> None:
    sts = statefulset(container={"resurces": {}})
    sts["spec"]["replica"] = 3
    decoded = decode("apps/v1", "StatefulSet", copy.deepcopy(sts))
    assert decoded is not None
    assert sorted(decoded.unknown) == ["spec.replica", "spec.template.spec.containers[0].resurces"]
    assert "replica" not in decoded.obj["spec"]


@pytest.mark.parametrize(("raw", "canonical"), [
    ("0.5", "500m"), (0.5, "500m"), ("1500m", "1500m"), ("2000", "2k"), ("1.5Gi", "1536Mi"), ("1024", "1024"),
    ("2048Ki", "2Mi"), ("1e3", "1e3"), ("0.1m", "100u"), (2, "2"),
])
def test_quantities_print_in_canonical_form(raw: Any, canonical: str) -> None:
    # resource.Quantity.String (CanonicalizeBytes): decimal exponents are multiples of three.
    assert str(parse(raw)) == canonical


@pytest.mark.parametrize("raw", ["1 core", "1.5.5", "Gi", "1GB", "", "0x10", "1e"])
def test_malformed_quantities_are_refused(raw: str) -> None:
    with pytest.raises(QuantityError):
        parse(raw)


def test_patterns_follow_go_regexp_not_python_dollar() -> None:
    # RE2's `$` is the end of the text; Python's also matches before a trailing newline.
    assert go_regexp("^[a-z]+$").search("abc")
    assert go_regexp("^[a-z]+$").search("abc\n") is None
    assert go_regexp("^[$a]+$").search("$a")  # a `$` inside a class is a literal


def test_a_flag_group_applies_to_the_rest_of_its_group_as_in_re2() -> None:
    # Kueue's podSetAssignments[].name pattern: `(?i)` after `^`, which Python's own `re` refuses.
    kueue_name = go_regexp("^(?i)[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    assert kueue_name.search("Runner-0") and kueue_name.search("runner-0\n") is None
    assert go_regexp("a(b(?i)c)d").search("abCd") and go_regexp("a(b(?i)c)d").search("abcD") is None


def test_quantities_are_stored_in_canonical_form() -> None:
    sts = statefulset(container={"resources": {"requests": {"cpu": 0.5, "memory": "1536Mi"}, "limits": {"cpu": "1000m", "memory": 2147483648}}})
    decoded = decode("apps/v1", "StatefulSet", sts)
    assert decoded is not None
    resources = decoded.obj["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "500m", "memory": "1536Mi"}, "limits": {"cpu": "1", "memory": "2147483648"}}  # a plain number stays decimal
