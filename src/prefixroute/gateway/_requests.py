"""What the router needs from an OpenAI request body: a routing key, the model, streaming or not.

Chat requests are keyed on their messages in order, roles included: each message renders as
``"role: content\\n"`` and the renders are concatenated. A conversation's next turn repeats the
previous messages and appends new ones, so its key extends the previous turn's key and the
router's chained block hashes match the whole earlier conversation. The key is hashed in
character mode (``block_chars`` characters per block): the gateway cannot know each replica's
tokenizer, and a character prefix is a token prefix for any tokenizer, up to the last block.

Completions are keyed on their prompt: a string in character mode, a list of token ids in token
mode. For a batch of prompts the first one decides (one request goes to one replica).

With a tokenizer (``--tokenizer``), ``_tokenize`` turns a text key into the engine's token ids
before routing; the key keeps the chat messages and ``add_special_tokens`` for that.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from prefixroute.gateway._errors import BadRequest, InvalidJSON
from prefixroute.gateway._jsondepth import MAX_DEPTH, too_deep


class Endpoint(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat_completions"
    OTHER = "other"  # any other /v1/* call: routed on load alone


@dataclass(frozen=True, slots=True)
class RouteKey:
    text: str | None  # routing text (character mode); None when routing on tokens
    tokens: list[int] | None  # prompt token ids (token mode)
    model: str | None  # requested model; None = any replica
    stream: bool  # the client asked for an SSE stream
    max_tokens: int  # requested output length, tokens (0 when not given)
    messages: list[Mapping[str, object]] | None = None  # chat messages, for a tokenizer
    add_special_tokens: bool | None = None  # vLLM's request field; None = the endpoint default


EMPTY_KEY = RouteKey("", None, None, False, 0)


def parse_body(body: bytes) -> object:
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from exc
    if too_deep(body, obj):  # see _jsondepth: deep bodies fail later, elsewhere
        raise InvalidJSON(f"the request body nests more than {MAX_DEPTH} levels deep")
    return obj


def route_key(endpoint: Endpoint, body: bytes) -> RouteKey:
    """The routing key of a request; raises InvalidJSON or BadRequest."""
    obj = parse_body(body)
    if not isinstance(obj, Mapping):
        raise BadRequest("the request body must be a JSON object")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    stream = obj.get("stream") is True
    max_tokens = obj.get("max_tokens", obj.get("max_completion_tokens", 0))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        max_tokens = 0  # the replica validates; the router only uses it as a hint
    special = obj.get("add_special_tokens")
    special = special if isinstance(special, bool) else None
    if endpoint is Endpoint.CHAT:
        messages = obj.get("messages")
        chat = chat_text(messages)  # validates: a non-empty list of objects
        assert isinstance(messages, list)
        return RouteKey(chat, None, model, stream, max_tokens, messages, special)
    if endpoint is Endpoint.COMPLETIONS:
        text, tokens = _prompt(obj.get("prompt"))
        return RouteKey(text, tokens, model, stream, max_tokens, None, special)
    return RouteKey("", None, model, stream, max_tokens)


def chat_text(messages: object) -> str:
    """``"role: content\\n"`` per message, in order."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    parts: list[str] = []
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise BadRequest("each message must be an object")
        parts.append(f"{msg.get('role')}: {_content_text(msg.get('content'))}\n")
    return "".join(parts)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):  # content parts: text as is, other parts by their JSON
        return "".join(
            p["text"]
            if isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
            else json.dumps(p, sort_keys=True, separators=(",", ":"))
            for p in content
        )
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def _prompt(prompt: object) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return first, None
        if isinstance(first, list):
            prompt = first
        if _token_ids(prompt):
            return None, list(prompt)
    if prompt is None:
        raise BadRequest("'prompt' is required")
    raise BadRequest("'prompt' must be a string, a list of strings or a list of token ids")


def _token_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in value
    )
