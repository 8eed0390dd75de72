"""Reading ``usage.prompt_tokens_details.cached_tokens`` from replica responses.

vLLM reports the engine's real prefix-cache hit there (with ``--enable-prompt-tokens-details``);
SGLang and OpenAI use the same field. The gateway only reads: the bytes it relays are never
re-encoded, so parsing happens on a copy the client never sees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping


def cached_tokens_of(obj: object) -> int | None:
    """The cached-token count in a parsed response or stream chunk, or None when absent."""
    if not isinstance(obj, Mapping):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, Mapping):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, Mapping):
        return None
    cached = details.get("cached_tokens")
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        return cached
    return None


def cached_tokens_in_body(body: bytes) -> int | None:
    """The cached-token count in a whole JSON response body (None when absent or not JSON)."""
    if b'"usage"' not in body:  # most bodies without usage skip the parse
        return None
    try:
        return cached_tokens_of(json.loads(body))
    except (ValueError, UnicodeDecodeError):
        return None
