"""The routing text of an OpenAI-style request: one rule for every front end (see ``request_key``).

Chat requests are keyed on their messages in order, roles included: each message renders as
``"role: content\\n"`` and the renders are concatenated. A conversation's next turn repeats the
previous messages and appends new ones, so its key extends the previous turn's key, and the
router's chained block hashes match the whole earlier conversation. Content parts render as
their text; any other part (an image, audio) as ``<part DIGEST>``, 128 bits of the SHA-256 of
its canonical JSON: different images stay apart in the key, and a 200 KB base64 image counts as
about ten tokens, not 50,000 (an engine counts an image at hundreds to a few thousand tokens;
the key's text, estimated at characters per token, was charged to a tenant's token budget
and the prefill predicted for it). A completion prompt is a string (character mode) or
token ids (token mode); of a batch of prompts the first decides.

Messages and parts may be mappings (a JSON body) or objects with the same attributes (Ray LLM's
request models), read through :func:`field_of`. Anything else raises :class:`InvalidPrompt`,
which each front end turns into its own error (HTTP 400, a failed Serve request).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from prefixroute.core.errors import InvalidPrompt

MAX_TOKEN_ID = 2**32  # token ids are hashed as uint32


def field_of(obj: object, name: str) -> tuple[bool, object]:
    """(found, value) of key ``name`` for a mapping, else of attribute ``name``."""
    if isinstance(obj, Mapping):
        return (True, obj[name]) if name in obj else (False, None)
    if hasattr(obj, name):
        return True, getattr(obj, name)
    return False, None


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_bool(value: object) -> bool | None:
    """``value`` as the engines read a boolean field of a request (vLLM's and SGLang's request
    models are pydantic's, in its lax mode): true and false, 1 and 0 (1.0 and 0.0), and the
    strings ``"true"``, ``"yes"``, ``"on"``, ``"1"``... in any case. None: not a boolean there
    (the engine refuses the request). A client's ``"stream": 1`` is a stream."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return True if value == 1 else False if value == 0 else None
    if isinstance(value, str):
        lower = value.lower()
        return True if lower in _TRUE else False if lower in _FALSE else None
    return None


def chat_text(messages: object) -> str:
    """``"role: content\\n"`` per message, in order."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidPrompt("'messages' must be a non-empty list")
    parts: list[str] = []
    for msg in messages:
        found_role, role = field_of(msg, "role")
        found_content, content = field_of(msg, "content")
        if not isinstance(msg, Mapping) and not (found_role or found_content):
            raise InvalidPrompt("each message must be an object")
        parts.append(f"{role}: {content_text(content)}\n")
    return "".join(parts)


def content_text(content: object) -> str:
    """A message's content as text: strings as they are, parts joined, anything else as JSON."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            _, kind = field_of(part, "type")
            _, text = field_of(part, "text")
            texts.append(text if kind == "text" and isinstance(text, str) else _digest(part))
        return "".join(texts)
    return _json(content)


def prompt_key(prompt: object) -> tuple[str | None, list[int] | None]:
    """(text, None) for a string prompt, (None, token ids) for ids; a batch's first decides."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first, None
        if isinstance(first, list):
            prompt = first
        if is_token_ids(prompt):
            assert isinstance(prompt, list)
            return None, list(prompt)
    if prompt is None:
        raise InvalidPrompt("'prompt' is required")
    raise InvalidPrompt("'prompt' must be a string, a list of strings or a list of token ids")


def prompts_in(prompt: object) -> int:
    """How many prompts ``prompt`` holds: a batch's length (a list of strings or of token-id
    lists), else 1."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return len(prompt)
    return 1


def is_token_ids(value: object) -> bool:
    """A list of ints in the uint32 range (bools are not token ids)."""
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TOKEN_ID for t in value
    )


def _json(value: object) -> str:
    # Canonical, so equal parts give equal keys; objects that are not JSON fall back to str().
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _digest(part: object) -> str:
    """A non-text part's stand-in in the routing text (module docstring)."""
    return f"<part {hashlib.sha256(_json(part).encode()).hexdigest()[:32]}>"
