"""Authentication by bearer token and RBAC authorization, as kube-apiserver's RBAC authorizer decides. Pure.

`allowed` evaluates the stored Roles, ClusterRoles, RoleBindings and ClusterRoleBindings the way
plugin/pkg/auth/authorizer/rbac does (no aggregation: an aggregated ClusterRole's rules are what it stores);
`forbidden_message` and `escalation_message` are its refusal texts. The group `system:masters` is allowed
everything, as the server's privileged group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .routing import Route

MASTERS = "system:masters"
RBAC_GROUP = "rbac.authorization.k8s.io"
Object = dict[str, Any]
RoleLookup = Callable[[str, str | None, str], Object | None]  # (kind, namespace, name) -> Role or ClusterRole


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ("system:authenticated",)


def service_account(namespace: str, name: str) -> User:
    """The user a ServiceAccount's token authenticates as, with the groups the server gives it."""
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


ADMIN = User("kubernetes-admin", (MASTERS, "system:authenticated"))


@dataclass(frozen=True)
class Attributes:
    """What RBAC authorizes: a verb on a resource[/subresource] of an API group, in a namespace, by name."""

    verb: str
    group: str
    resource: str
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None

    @property
    def combined(self) -> str:
        return self.resource + (f"/{self.subresource}" if self.subresource else "")


def request_attributes(method: str, route: Route, watch: bool) -> Attributes:
    """A resource request's attributes as the server's RequestInfo resolver derives them."""
    named = route.name is not None
    verb = {"GET": "watch" if watch else "get" if named else "list", "POST": "create", "PUT": "update",
            "PATCH": "patch", "DELETE": "delete" if named else "deletecollection"}[method]
    namespace = route.name if route.plural == "namespaces" else route.namespace
    return Attributes(verb, route.group, route.plural, route.subresource, namespace, route.name)


def allowed(user: User, attrs: Attributes, bindings: Iterable[Object], role: RoleLookup) -> bool:
    """Whether any binding of the user (a ClusterRoleBinding anywhere, a RoleBinding in the request's namespace)
    refers to a role with a rule that covers the request."""
    if MASTERS in user.groups:
        return True
    return any(rule_allows(rule, attrs) for rule in rules_of(user, attrs.namespace, bindings, role))


def rules_of(user: User, namespace: str | None, bindings: Iterable[Object], role: RoleLookup) -> list[Object]:
    rules: list[Object] = []
    for binding in bindings:
        binding_ns = binding["metadata"].get("namespace")
        if binding_ns and binding_ns != namespace:
            continue
        if not any(_subject_is(subject, user, binding_ns) for subject in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        found = role(ref["kind"], binding_ns if ref["kind"] == "Role" else None, ref["name"])
        rules += (found or {}).get("rules") or []
    return rules


def _subject_is(subject: Object, user: User, binding_ns: str | None) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return bool(name == user.name)
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace') or binding_ns}:{name}"
    return False


def rule_allows(rule: Object, attrs: Attributes) -> bool:
    """rbac.RuleAllows for a resource request (validation.go: VerbMatches, APIGroupMatches, ResourceMatches,
    ResourceNameMatches)."""
    verbs, groups = rule.get("verbs") or [], rule.get("apiGroups") or []
    if not (("*" in verbs or attrs.verb in verbs) and ("*" in groups or attrs.group in groups)):
        return False
    if not any(r == "*" or r == attrs.combined or (attrs.subresource and r == f"*/{attrs.subresource}")
               for r in rule.get("resources") or []):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def forbidden_message(user: User, attrs: Attributes) -> str:
    """The RBAC refusal after the Status's `<resource> "<name>" is forbidden: ` (authorization.go)."""
    scope = f"in the namespace {_q(attrs.namespace)}" if attrs.namespace else "at the cluster scope"
    return (f"User {_q(user.name)} cannot {attrs.verb} resource {_q(attrs.combined)} in API group {_q(attrs.group)} "
            f"{scope}")


def missing_rights(user: User, namespace: str | None, granted: list[Object], bindings: Iterable[Object],
                   role: RoleLookup) -> list[Object]:
    """The atomic rules of `granted` the user does not hold (ConfirmNoEscalation: a binding may only grant what
    its creator holds, unless the creator may `bind` the role)."""
    missing = []
    for rule in granted:
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                resource_name, _, sub = resource.partition("/")
                for verb in rule.get("verbs") or []:
                    for name in rule.get("resourceNames") or [None]:
                        attrs = Attributes(verb, group, resource_name, sub or None, namespace, name)
                        if not allowed(user, attrs, bindings, role):
                            missing.append({"apiGroups": [group], "resources": [resource], "verbs": [verb],
                                            **({"resourceNames": [name]} if name else {})})
    return missing


def escalation_message(user: User, missing: list[Object]) -> str:
    """rbac's escalation refusal: the user, its groups and the missing rules, compacted (CompactRules merges the
    verbs of one group's one resource), each as CompactString writes it, sorted (Go's %q of a []string is
    `["a" "b"]`)."""
    merged: dict[tuple[str, str, str | None], list[str]] = {}
    for rule in missing:
        names = rule.get("resourceNames") or [None]
        merged.setdefault((rule["apiGroups"][0], rule["resources"][0], names[0]), []).extend(rule["verbs"])

    def compact(group: str, resource: str, name: str | None, verbs: list[str]) -> str:
        fields = [("APIGroups", [group]), ("Resources", [resource]), ("ResourceNames", [name] if name else []),
                  ("Verbs", verbs)]
        return "{" + ", ".join(f"{label}:{_q_list(values)}" for label, values in fields if values) + "}"

    rules = sorted(compact(*key, verbs) for key, verbs in merged.items())
    return (f"user {_q(user.name)} (groups={_q_list(list(user.groups))}) is attempting to grant RBAC permissions "
            "not currently held:\n" + "\n".join(rules))


def owner_reference_refusals(old: Object | None, new: Object, target: Attributes, may: Callable[[Attributes], bool],
                             plural_of: Callable[[str, str], tuple[str, str] | None]) -> str | None:
    """OwnerReferencesPermissionEnforcement (plugin/pkg/admission/gc) for writing `new` over `old` (None: a create)
    at `target` (its group, resource, namespace and name): changing an existing object's ownerReferences needs
    `delete` on it; a new `blockOwnerDeletion: true` needs `update` on the owner's finalizers."""
    refs = new["metadata"].get("ownerReferences") or []
    old_refs = (old or {}).get("metadata", {}).get("ownerReferences") or []
    if _ref_keys(refs) == _ref_keys(old_refs) and old is not None:
        return None
    if old is not None and not may(Attributes("delete", target.group, target.resource, None, target.namespace,
                                              target.name)):
        return "cannot set an ownerRef on a resource you can't delete: , <nil>"
    blocking_before = {r.get("uid") for r in old_refs if r.get("blockOwnerDeletion")}
    for ref in refs:
        if not ref.get("blockOwnerDeletion") or ref.get("uid") in blocking_before:
            continue
        mapped = plural_of(ref.get("apiVersion", ""), ref.get("kind", ""))
        if mapped is None:
            return f"could not find the requested resource: no matches for kind \"{ref.get('kind')}\""
        group, plural = mapped
        if not may(Attributes("update", group, plural, "finalizers", target.namespace, ref.get("name"))):
            return "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: , <nil>"
    return None


def _ref_keys(refs: list[Object]) -> list[tuple[Any, ...]]:
    return sorted((r.get("apiVersion"), r.get("kind"), r.get("name"), r.get("uid"), bool(r.get("controller")),
                   bool(r.get("blockOwnerDeletion"))) for r in refs)


def _q_list(values: list[str]) -> str:
    return "[" + " ".join(_q(v) for v in values) + "]"


def _q(text: str | None) -> str:
    """Go's %q for the plain ASCII names used here."""
    return '"' + (text or "").replace("\\", "\\\\").replace('"', '\\"') + '"'
