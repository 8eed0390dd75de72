"""Anthropic's Messages API (``POST /v1/messages``) as vLLM 0.32 answers it
(``vllm/entrypoints/anthropic``), on the emulated engine.

The request: ``model``, ``max_tokens`` (required, as Anthropic's), ``messages`` (roles and a
string or text blocks as content; other blocks are left out of the prompt: no tools or images
here), ``system`` (a string or text blocks, rendered first; Claude Code's per-request
``x-anthropic-billing-header`` block dropped, as vLLM drops it), ``stream`` and ``cache_salt``.

The answer is a ``message``: one text block, ``stop_reason`` ``max_tokens`` (every answer here
runs to its limit), and ``usage`` in Anthropic's split as vLLM 0.32 fills it: the prompt's tokens
read from the cache (``cache_read_input_tokens``), its full blocks computed and cached now
(``cache_creation_input_tokens``), and the rest (``input_tokens``: its last, partial block).
A stream is named events (``event: TYPE`` and ``data: {"type": TYPE, ...}``): ``message_start``
(the message, empty, with the prompt's usage), then ``content_block_start``, one
``content_block_delta`` per token, ``content_block_stop``, ``message_delta`` (the stop reason
and the whole usage) and ``message_stop``; no ``[DONE]``. Usage is always in it: vLLM asks its
engine for it on every Messages stream.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from prefixroute.core import Endpoint
from prefixroute.emulate._errors import InvalidRequest
from prefixroute.emulate._openai import ParsedRequest, adapter_of, positive, salt_of, stream_of
from prefixroute.emulate._tokenizer import filler, render_chat, tokenize

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request system text

Message = tuple[str, str]  # (role, text)


def parse_messages(
    body: object, served_model: str, adapters: tuple[str, ...]
) -> ParsedRequest:
    """Validate a Messages request into its parse (tokens: the rendered prompt). Raises
    InvalidRequest (400) or ModelNotFound (404)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("'model' is required", "model")
    adapter = adapter_of(body, served_model, adapters)
    if "max_tokens" not in body:
        raise InvalidRequest("'max_tokens' is required", "max_tokens")
    limit = positive(body["max_tokens"], "max_tokens")
    prompt: list[Message] = []
    system = body.get("system")
    if system is not None:
        text = _text(system, "system")
        if text:
            prompt.append(("system", text))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list", "messages")
    for message in messages:
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequest("each message must be an object with a 'role'", "messages")
        text = _text(message.get("content"), "messages")
        if message["role"] != "system" or text:
            prompt.append((message["role"], text))
    return ParsedRequest(Endpoint.MESSAGES, tokenize(render_chat(prompt)), limit,
                         stream_of(body), salt_of(body), adapter, include_usage=True)  # fmt: skip


def _text(content: object, field: str) -> str:
    """A content's text: a string, or its text blocks joined (the attribution block left out)."""
    if isinstance(content, str):
        return "" if content.startswith(BILLING_HEADER) else content
    if not isinstance(content, list):
        raise InvalidRequest(f"'{field}' content must be a string or a list of blocks", field)
    texts = []
    for block in content:
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise InvalidRequest("each content block must be an object with a 'type'", field)
        if block["type"] != "text":
            continue  # an image, a tool call or result: not rendered here
        text = block.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("a text block needs a string 'text'", field)
        if not text.startswith(BILLING_HEADER):
            texts.append(text)
    return "".join(texts)


class MessagesWriter:
    """Builds one Messages request's answer or stream events (the app's three calls)."""

    def __init__(self, parsed: ParsedRequest, model: str, block_size: int) -> None:
        self.parsed = parsed
        self.model = parsed.adapter or model
        self.block_size = block_size
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def usage(self, generated: int, cached_tokens: int) -> dict[str, int]:
        prompt = len(self.parsed.tokens)
        written = max(0, prompt // self.block_size * self.block_size - cached_tokens)
        return {"input_tokens": prompt - cached_tokens - written, "output_tokens": generated,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": cached_tokens}  # fmt: skip

    def message(self, generated: int, cached_tokens: int, done: bool) -> dict[str, Any]:
        content = [{"type": "text", "text": filler(0, generated)}] if done else []
        return {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": "max_tokens" if done else None,
            "stop_sequence": None, "usage": self.usage(generated, cached_tokens),
        }  # fmt: skip

    def body(self, generated: int, cached_tokens: int) -> bytes:
        return _dumps(self.message(generated, cached_tokens, done=True)).encode()

    def events(self, start: int, stop: int, cached_tokens: int) -> bytes:
        out: list[str] = []
        if start == 0:
            opening = self.message(0, cached_tokens, done=False)
            out.append(_event("message_start", message=opening))
            block = {"type": "text", "text": ""}
            out.append(_event("content_block_start", index=0, content_block=block))
        for i in range(start, stop):
            delta = {"type": "text_delta", "text": filler(i, i + 1)}
            out.append(_event("content_block_delta", index=0, delta=delta))
        return "".join(out).encode()

    def end(self, generated: int, cached_tokens: int, usage: bool) -> bytes:
        stop = {"stop_reason": "max_tokens", "stop_sequence": None}
        return "".join([
            _event("content_block_stop", index=0),
            _event("message_delta", delta=stop, usage=self.usage(generated, cached_tokens)),
            _event("message_stop"),
        ]).encode()  # fmt: skip


def _event(kind: str, **fields: object) -> str:
    return f"event: {kind}\ndata: {_dumps({'type': kind, **fields})}\n\n"


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))
