"""What the router needs from an OpenAI request body: a routing key, the model, streaming or not.

Chat requests are keyed on their messages in order, roles included (the rule is in
:mod:`prefixroute.core.prompt_key`, shared with the Ray Serve router), so a conversation's next
turn extends the previous turn's key and the router's chained block hashes match the whole
earlier conversation. The key is hashed in character mode (``block_chars`` characters per
block): the gateway cannot know each replica's tokenizer, and a character prefix is a token
prefix for any tokenizer, up to the last block.

Completions are keyed on their prompt: a string in character mode, a list of token ids in token
mode. For a batch of prompts the first one decides (one request goes to one replica).

With a tokenizer (``--tokenizer``), ``_tokenize`` turns a text key into the engine's token ids
before routing; the key keeps the chat messages and ``add_special_tokens`` for that.

**What goes upstream is what we parsed.** A JSON body is read as strict UTF-8 (Python's decoder
would also take UTF-16 and UTF-32, which a replica may not), without ``NaN``/``Infinity`` (not
JSON) and without lone surrogates (not Unicode), and is sent to the replica re-encoded from the
parsed object (:func:`encode_body`). So the replica reads exactly the fields the gateway routed
and admitted on: a duplicate key, a compression header or an odd encoding cannot make it read
something else, or fail on input we passed (a failure that would be blamed on the replica).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from prefixroute.core import prompt_key
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


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def parse_body(body: bytes) -> object:
    """The JSON value of a request body; raises InvalidJSON (see the module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from exc
    if too_deep(body, obj):  # see _jsondepth: deep bodies fail later, elsewhere
        raise InvalidJSON(f"the request body nests more than {MAX_DEPTH} levels deep")
    return obj


def encode_body(obj: object) -> bytes:
    """``obj`` as the bytes a replica gets: compact UTF-8 JSON; InvalidJSON for a string with
    a lone surrogate (``"\\ud800"`` parses, but is no Unicode text a replica can encode)."""
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJSON("the request body holds a lone surrogate (not Unicode text)") from None


def route_key(endpoint: Endpoint, body: bytes) -> RouteKey:
    """The routing key of a request; raises InvalidJSON or BadRequest."""
    return key_of(endpoint, parse_body(body))


def key_of(endpoint: Endpoint, obj: object) -> RouteKey:
    """The routing key of a parsed request body; raises BadRequest."""
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
    """``"role: content\\n"`` per message, in order (see :mod:`prefixroute.core.prompt_key`)."""
    try:
        return prompt_key.chat_text(messages)
    except prompt_key.InvalidPrompt as exc:
        raise BadRequest(str(exc)) from None


def _prompt(prompt: object) -> tuple[str | None, list[int] | None]:
    try:
        return prompt_key.prompt_key(prompt)
    except prompt_key.InvalidPrompt as exc:
        raise BadRequest(str(exc)) from None
