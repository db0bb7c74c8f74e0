"""The three PATCH flavours of the API server, as pure functions over JSON-like values."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from .errors import bad_request, status_error

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# patchMergeKey of the list fields the operator's manifests use (from the Kubernetes Go types).
MERGE_KEYS = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "conditions": "type", "ownerReferences": "uid",
    "hostAliases": "ip", "topologySpreadConstraints": "topologyKey",
}
# Primitive lists with patchStrategy=merge: a strategic patch adds to them instead of replacing.
MERGED_PRIMITIVE_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch; a failed `test` or a bad path is a 422 as on the real server."""
    if not isinstance(operations, list):
        raise bad_request("json patch body must be a list of operations")
    try:
        return jsonpatch.JsonPatch(operations).apply(copy.deepcopy(target))
    except jsonpatch.JsonPatchTestFailed as e:
        raise status_error(422, "Invalid", f"the server rejected our request due to an error in our request: {e}") from e
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, KeyError, IndexError, TypeError) as e:
        raise status_error(422, "Invalid", f"the server rejected our request due to an error in our request: {e}") from e


def _merge_key(field: str, items: list[Any]) -> str | None:
    key = MERGE_KEYS.get(field)
    if field == "ports":  # container ports merge on containerPort, service ports on port
        key = "containerPort" if any(isinstance(i, dict) and "containerPort" in i for i in items) else "port"
    return key


def _strategic_list(field: str, target: list[Any], patch: list[Any]) -> list[Any]:
    if field in MERGED_PRIMITIVE_LISTS:
        return list(target) + [item for item in patch if item not in target]
    key = _merge_key(field, patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy(patch)
    if any(i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy({k: v for k, v in i.items() if k != "$patch"}) for i in patch if i.get("$patch") != "replace"]
    result = [copy.deepcopy(i) for i in target]
    for item in patch:
        positions = [n for n, existing in enumerate(result) if isinstance(existing, dict) and existing.get(key) == item.get(key)]
        if item.get("$patch") == "delete":
            result = [r for n, r in enumerate(result) if n not in positions]
        elif positions:
            result[positions[0]] = strategic_merge_patch(result[positions[0]], item)
        else:
            result.append(strategic_merge_patch({}, item))
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge patch for the fields in MERGE_KEYS; other lists replace, as in a merge patch.

    Directives honoured: `$patch: delete|replace` on maps and list items; `$setElementOrder`,
    `$retainKeys` and `$deleteFromPrimitiveList` are accepted and ignored.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _strategic_list(key, result[key], value)
        elif isinstance(value, list):
            result[key] = [strategic_merge_patch({}, i) if isinstance(i, dict) else i for i in value]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result
