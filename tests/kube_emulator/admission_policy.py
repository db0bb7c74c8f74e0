"""ValidatingAdmissionPolicy as the API server's admission plugin applies it (plugin/policy/validating), after
authorization: each binding whose policy's matchConstraints cover the request is evaluated once per parameter its
paramRef selects (in the request's namespace for a namespaced paramKind), variables then validations, with the same
CEL language; a failed validation or an expression that errs (failurePolicy Fail) denies, and the server reports
the first denial. Pure: the caller passes the stored policies, bindings and a parameter lookup."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import cel
from kmock import KubernetesError

from . import errors
from .authz import User
from .selectors import label_matcher, selector_string

Object = dict[str, Any]
# (apiVersion, kind, namespace) of a paramKind -> the objects of that kind there.
ParamLookup = Callable[[str, str, str | None], list[Object]]


@dataclass(frozen=True)
class Request:
    """The admission attributes of one request: what `request` holds in a policy's CEL."""

    operation: str  # CREATE, UPDATE, DELETE or CONNECT
    group: str
    version: str
    resource: str
    subresource: str | None
    kind: str  # of the object: PodExecOptions for pods/exec
    namespace: str | None
    name: str
    user: User | None  # None: the emulator authenticates nobody

    def cel(self) -> Object:
        return {
            "kind": {"group": self.group, "version": self.version, "kind": self.kind},
            "resource": {"group": self.group, "version": self.version, "resource": self.resource},
            "subResource": self.subresource or "", "operation": self.operation, "name": self.name,
            "namespace": self.namespace or "",
            "userInfo": {"username": self.user.name if self.user else "", "groups": list(self.user.groups) if self.user else []},
        }


def covers(policy: Object, request: Request) -> bool:
    """Whether the policy's matchConstraints.resourceRules match the request (namespaceSelector,
    objectSelector and excludeResourceRules are not read)."""
    resource = request.resource + (f"/{request.subresource}" if request.subresource else "")
    for rule in policy["spec"].get("matchConstraints", {}).get("resourceRules", []):
        if (request.group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", [])) \
                and (request.version in rule.get("apiVersions", []) or "*" in rule.get("apiVersions", [])) \
                and (request.operation in rule.get("operations", []) or "*" in rule.get("operations", [])) \
                and (resource in rule.get("resources", []) or "*" in rule.get("resources", [])):
            return True
    return False


def _evaluate(expression: str, context: cel.Context) -> Any:
    try:
        return cel.compile(expression).execute(context)
    except Exception as exc:  # an expression that cannot be evaluated: its error is the decision
        return exc


def denials(policy: Object, params: Iterable[Object | None], request: Request, obj: Object | None,
            old: Object | None) -> list[str]:
    """The messages of every validation the request fails, under each parameter (all of them, in order; the server
    reports the first)."""
    spec = policy["spec"]
    failed = []
    for param in params:
        context = cel.Context()
        context.add_variable("request", request.cel())
        context.add_variable("object", obj)
        context.add_variable("oldObject", old)
        context.add_variable("params", param)
        variables: dict[str, Any] = {}
        for variable in spec.get("variables", []):
            context.add_variable("variables", variables)
            variables[variable["name"]] = _evaluate(variable["expression"], context)
        context.add_variable("variables", variables)
        for validation in spec.get("validations", []):
            result = _evaluate(validation["expression"], context)
            if isinstance(result, Exception):
                failed.append(f"expression '{validation['expression']}' resulted in error: {result}")
            elif result is not True:
                failed.append(validation.get("message") or f"failed expression: {validation['expression']}")
    return failed


def binding_params(policy: Object, binding: Object, namespace: str | None, lookup: ParamLookup) -> list[Object | None] | None:
    """The parameters a binding gives its policy for a request in `namespace`: [None] without a paramKind; None
    when none is found and parameterNotFoundAction is Allow (nothing to check)."""
    kind = policy["spec"].get("paramKind")
    ref = binding["spec"].get("paramRef")
    if kind is None or ref is None:
        return [None]
    found = lookup(kind["apiVersion"], kind["kind"], ref.get("namespace") or namespace)
    if ref.get("name"):
        found = [p for p in found if p["metadata"]["name"] == ref["name"]]
    elif ref.get("selector") is not None:
        matches = label_matcher(selector_string(ref["selector"]))
        found = [p for p in found if matches(p)]
    if found:
        return list(found)
    return None if ref.get("parameterNotFoundAction", "Deny") == "Allow" else []


def refusal(policies: Iterable[Object], bindings: Iterable[Object], lookup: ParamLookup, request: Request,
            obj: Object | None, old: Object | None) -> KubernetesError | None:
    """The server's refusal of the request (422 Invalid, the validations' default reason), or None to admit it."""
    by_name = {p["metadata"]["name"]: p for p in policies}
    for binding in sorted(bindings, key=lambda b: b["metadata"]["name"]):
        policy = by_name.get(binding["spec"].get("policyName", ""))
        if policy is None or not covers(policy, request) or "Deny" not in binding["spec"].get("validationActions", []):
            continue
        params = binding_params(policy, binding, request.namespace, lookup)
        if params is None:
            continue
        failed = denials(policy, params, request, obj, old) if params else [
            "no params found for policy binding with `Deny` parameterNotFoundAction"]
        if failed:
            message = (f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
                       f"'{binding['metadata']['name']}' denied request: {failed[0]}")
            subject = errors.resource_label(request.group, request.resource) + (f' "{request.name}"' if request.name else "")
            return errors.status_error(422, "Invalid", f"{subject} is forbidden: {message}", {
                "name": request.name, "group": request.group, "kind": request.resource, "causes": [{"message": message}]})
    return None
