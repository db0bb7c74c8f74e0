"""Read TrainingRun / HarnessPool / EnginePool manifests (files, YAML text or dicts) into the API models."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

import yaml
from harnessrl.operator.api.common import API_VERSION
from harnessrl.operator.api.enginepool import EnginePool
from harnessrl.operator.api.harnesspool import HarnessPool
from harnessrl.operator.api.trainingrun import TrainingRun
from pydantic import ValidationError

Resource: TypeAlias = TrainingRun | HarnessPool | EnginePool
KINDS: dict[str, type[TrainingRun] | type[HarnessPool] | type[EnginePool]] = {
    "TrainingRun": TrainingRun,
    "HarnessPool": HarnessPool,
    "EnginePool": EnginePool,
}


class ManifestError(ValueError):
    """A manifest that is not a valid TrainingRun, HarnessPool or EnginePool; the message says where and why."""


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """The manifest path of an error location: pydantic adds union member tags ('int', 'str') to
    locations; walking the input keeps only the keys and indices that the user wrote (or omitted)."""
    out, node = "", data
    for part in loc:
        if isinstance(node, Mapping) and isinstance(part, str):
            out += f".{part}" if out else part
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int):
            out += f"[{part}]"
            node = node[part] if part < len(node) else None
    return out or "(top level)"


def format_errors(error: ValidationError, data: Any) -> list[str]:
    """One 'field.path: message' line per problem, in the manifest's own (camelCase) names."""
    return [f"{_where(data, item['loc'])}: {item['msg']}" for item in error.errors(include_url=False)]


def parse_manifest(data: Mapping[str, Any], source: str = "manifest") -> Resource:
    """Validate one manifest dict; raise ManifestError naming `source` and every bad field."""
    if not isinstance(data, Mapping):
        raise ManifestError(f"{source}: expected a mapping (a Kubernetes object), got {type(data).__name__}")
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if api_version != API_VERSION:
        raise ManifestError(f"{source}: apiVersion must be {API_VERSION}, got {api_version!r}")
    if kind not in KINDS:
        raise ManifestError(f"{source}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        return KINDS[kind].model_validate(dict(data))
    except ValidationError as error:
        metadata = data.get("metadata")
        name = metadata.get("name", "?") if isinstance(metadata, Mapping) else "?"
        problems = "\n  ".join(format_errors(error, data))
        raise ManifestError(f"{source}: {kind} {name!r} is invalid:\n  {problems}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML where a key written twice in one mapping is an error (PyYAML keeps the last one silently;
    kubectl refuses it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"mapping key {key!r} is already defined above", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _UniqueKeyLoader.construct_mapping)


def _documents(source: str | Path | Mapping[str, Any]) -> tuple[str, list[Any]]:
    if isinstance(source, Mapping):
        return "manifest", [source]
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error.strerror}") from None
    try:
        docs = [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from None
    return str(path), docs


def load_manifests(source: str | Path | Mapping[str, Any]) -> list[Resource]:
    """Every resource in a (multi-document) YAML file, or the one in a dict."""
    name, docs = _documents(source)
    if not docs:
        raise ManifestError(f"{name}: no manifest in it")
    return [
        parse_manifest(doc, name if len(docs) == 1 else f"{name} (document {i + 1})")
        for i, doc in enumerate(docs)
    ]


def load_manifest(source: str | Path | Mapping[str, Any]) -> Resource:
    """The one resource in a YAML file (path) or dict; ManifestError if there is not exactly one, or it's bad."""
    resources = load_manifests(source)
    if len(resources) != 1:
        raise ManifestError(f"{source}: expected one manifest, found {len(resources)}")
    return resources[0]
