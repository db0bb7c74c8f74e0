"""Kubernetes Status errors, raised by the store and rendered by kmock as `kind: Status` bodies."""

from __future__ import annotations

from typing import Any

from kmock import KubernetesError


def status_error(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> KubernetesError:
    # kmock renders KubernetesError as a Status object; details must be non-empty or it adds a traceback.
    return KubernetesError(status=code, reason=reason, message=message, details=details or {"causes": []})


def resource_label(group: str, plural: str) -> str:
    """How the API server names a resource in messages: `pods`, `trainingruns.harnessrl.io`."""
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> KubernetesError:
    return status_error(
        404, "NotFound", f'{resource_label(group, plural)} "{name}" not found',
        {"name": name, "group": group, "kind": plural},
    )


def endpoint_not_found(path: str) -> KubernetesError:
    return status_error(404, "NotFound", f"the server could not find the requested resource ({path})")


def already_exists(group: str, plural: str, name: str) -> KubernetesError:
    return status_error(
        409, "AlreadyExists", f'{resource_label(group, plural)} "{name}" already exists',
        {"name": name, "group": group, "kind": plural},
    )


def conflict(group: str, plural: str, name: str, why: str) -> KubernetesError:
    return status_error(
        409, "Conflict",
        f'Operation cannot be fulfilled on {resource_label(group, plural)} "{name}": {why}',
        {"name": name, "group": group, "kind": plural},
    )


def stale_conflict(group: str, plural: str, name: str) -> KubernetesError:
    return conflict(
        group, plural, name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )


def bad_request(message: str) -> KubernetesError:
    return status_error(400, "BadRequest", message)


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> KubernetesError:
    """422 the way the API server words it: `Kind.group "name" is invalid: field: detail`."""
    # A rule on the object's root has no field path; Go prints the nil path as <nil>.
    texts = [f"{c.get('field') or '<nil>'}: {c['message']}" for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    qualified = f"{kind}.{group}" if group else kind
    return status_error(
        422, "Invalid", f'{qualified} "{name}" is invalid: {joined}',
        {"name": name, "group": group, "kind": kind, "causes": causes},
    )


def unsupported_media_type(content_type: str) -> KubernetesError:
    return status_error(
        415, "UnsupportedMediaType",
        f'the body of the request was in an unknown format - accepted media types include: '
        f'application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml '
        f'(got "{content_type}")',
    )


def gone(message: str) -> KubernetesError:
    return status_error(410, "Expired", message)


def forbidden(message: str) -> KubernetesError:
    return status_error(403, "Forbidden", message)


def forbidden_resource(group: str, plural: str, name: str | None, why: str) -> KubernetesError:
    """403 for one resource (NewForbidden): `secrets "x" is forbidden: why`; Go omits the empty details."""
    subject = resource_label(group, plural) + (f' "{name}"' if name else "")
    details = {key: value for key, value in (("name", name), ("group", group), ("kind", plural)) if value}
    return status_error(403, "Forbidden", f"{subject} is forbidden: {why}", details)


def request_entity_too_large(limit: int) -> KubernetesError:
    return status_error(413, "RequestEntityTooLarge", f"Request entity too large: limit is {limit}")


def unauthorized() -> KubernetesError:
    return status_error(401, "Unauthorized", "Unauthorized")


def status_body(error: KubernetesError) -> dict[str, Any]:
    """The Status object as it appears inside a watch ERROR event."""
    return {
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "code": error.status, "reason": error.reason, "message": error.message, "details": error.details,
    }
