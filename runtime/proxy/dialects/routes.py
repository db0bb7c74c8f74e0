"""Which dialect a request speaks (by its path) and which session it belongs to (by its key).

Dialect surfaces (POST):
  /v1/chat/completions                         openai_chat
  /v1/responses                                openai_responses
  /v1/messages, /v1/messages/count_tokens      anthropic
  /v1beta/models/{model}:generateContent       gemini   (also /v1/ and /v1alpha/ for the version,
  /v1beta/models/{model}:streamGenerateContent            and :countTokens)

Any path before these (`/anything/v1/messages`) is accepted and returned as `prefix`: Claude
Code and Gemini CLI keep the path of their base URL. The session key is the harness's API key,
read from `x-api-key` (Anthropic), `x-goog-api-key` or `?key=` (Gemini), or
`Authorization: Bearer` (OpenAI, and what most wrappers send).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from harnessrl.runtime.proxy.dialects.anthropic import AnthropicDialect
from harnessrl.runtime.proxy.dialects.base import Dialect, Operation, RouteInfo
from harnessrl.runtime.proxy.dialects.gemini import GeminiDialect
from harnessrl.runtime.proxy.dialects.openai_chat import OpenAIChatDialect
from harnessrl.runtime.proxy.dialects.openai_responses import OpenAIResponsesDialect

DIALECTS: dict[str, Dialect] = {
    d.name: d for d in (OpenAIChatDialect(), OpenAIResponsesDialect(), AnthropicDialect(), GeminiDialect())
}

# The dialect to answer in when the path names none (unknown path, /v1/models, ...).
DEFAULT_DIALECT = "openai_chat"

_PREFIX = r"(?P<prefix>(?:/[^/]+)*?)"
_FIXED: list[tuple[re.Pattern[str], str, Operation]] = [
    (re.compile(_PREFIX + r"/v1/chat/completions/?"), "openai_chat", Operation.GENERATE),
    (re.compile(_PREFIX + r"/v1/responses/?"), "openai_responses", Operation.GENERATE),
    (re.compile(_PREFIX + r"/v1/messages/count_tokens/?"), "anthropic", Operation.COUNT_TOKENS),
    (re.compile(_PREFIX + r"/v1/messages/?"), "anthropic", Operation.GENERATE),
]
_GEMINI = re.compile(
    _PREFIX + r"/(?:v1|v1beta|v1alpha)/models/(?P<model>[^/:]+):(?P<action>generateContent|streamGenerateContent|countTokens)"
)


def match_route(path: str, query: Mapping[str, str] | None = None) -> RouteInfo | None:
    """The route of a dialect request, or None if no dialect serves this path."""
    q = dict(query or {})
    for pattern, dialect, operation in _FIXED:
        m = pattern.fullmatch(path)
        if m:
            return RouteInfo(dialect=dialect, operation=operation, prefix=m["prefix"], query=q)
    m = _GEMINI.fullmatch(path)
    if m:
        action = m["action"]
        return RouteInfo(
            dialect="gemini",
            operation=Operation.COUNT_TOKENS if action == "countTokens" else Operation.GENERATE,
            model=m["model"],
            stream=action == "streamGenerateContent",
            prefix=m["prefix"],
            query=q,
        )
    return None


def dialect_for(route: RouteInfo | None) -> Dialect:
    """The dialect that parses and answers this route (the default one for unknown paths)."""
    return DIALECTS[route.dialect if route else DEFAULT_DIALECT]


def dialect_for_path(path: str) -> Dialect:
    """The dialect to answer errors in for any path, e.g. a 401 before the body is read."""
    return dialect_for(match_route(path))


def session_key(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> str | None:
    """The session id a harness sends as its API key, or None when it sends none.

    `headers` may be case-sensitive (a plain dict) or not (Starlette's Headers)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("x-api-key", "x-goog-api-key"):
        value = lowered.get(name, "").strip()
        if value:
            return value
    scheme, _, token = lowered.get("authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = (query or {}).get("key", "").strip()
    return key or None
