"""Request bodies are read by pydantic-core's JSON parser with json.loads deciding whatever it refuses: what is
accepted, the values read and the errors must all be json.loads's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from harnessrl.runtime.proxy.dialects.base import DialectError, load_json_object
from hypothesis import given, settings
from hypothesis import strategies as st

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def _json_loads_outcome(body: bytes) -> Any:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return f"request body is not valid JSON: {exc}"
    return data if isinstance(data, dict) else f"request body must be a JSON object, not {type(data).__name__}"


def _outcome(body: bytes) -> Any:
    try:
        return load_json_object(body)
    except DialectError as exc:
        return exc.message


@settings(max_examples=120, deadline=None)
@given(value=st.dictionaries(st.text(max_size=8), values, max_size=5), cut=st.integers(0, 200),
       noise=st.binary(max_size=3), ensure_ascii=st.booleans())
def test_any_body_reads_as_json_loads_reads_it(value: dict[str, Any], cut: int, noise: bytes, ensure_ascii: bool) -> None:
    whole = json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
    for body in (whole, whole[:cut] + noise + whole[cut:], whole[:cut]):
        assert _outcome(body) == _json_loads_outcome(body)


@pytest.mark.parametrize(
    "body",
    [b'{"a":"\\ud800"}', b'\xef\xbb\xbf{"a":1}', b'{"a":NaN,"b":-Infinity}', b'{"a":1,"a":2}',
     b'{"a":12345678901234567890123456789}', b'{"a":1e400}', b'{"a":"\xff"}', b'{"a":01}', b"[1]",
     '{"a":"é"}'.encode("utf-16")],
)
def test_edge_cases_read_as_json_loads_reads_them(body: bytes) -> None:
    assert repr(_outcome(body)) == repr(_json_loads_outcome(body))
