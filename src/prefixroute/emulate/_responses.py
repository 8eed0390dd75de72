"""OpenAI's Responses API (``POST /v1/responses``, ``GET /v1/responses/{id}``) as vLLM 0.32's
OpenAI server answers it, on the emulated engine.

The request: ``input`` (a string, or items: messages whose content is a string or
``input_text`` / ``output_text`` parts), ``instructions`` (the system message, rendered first),
``max_output_tokens`` (vLLM's default is what the window leaves; here
:data:`~prefixroute.emulate._openai.DEFAULT_MAX_TOKENS`), ``stream``, ``cache_salt`` and
``previous_response_id``. Only messages are taken as input items (no tools here).

The answer is a ``response`` object: ``output`` holds one assistant message, ``status`` is
``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` (every answer here runs
to its limit, as vLLM reports it), and ``usage`` counts ``input_tokens``,
``input_tokens_details.cached_tokens`` and ``output_tokens``. A stream is typed events
(``event: TYPE`` and ``data: {..., "type": TYPE, "sequence_number": n}``): ``response.created``,
``response.in_progress``, the output item and its text part added, one
``response.output_text.delta`` per token, then the text, part and item done and
``response.completed`` with the whole response and its usage; no ``[DONE]``.

**Stored responses.** Every answer is stored (``store``, true by default, as OpenAI does; vLLM
does so only with ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a request naming it in
``previous_response_id`` is rendered as its conversation (the stored input and answer) followed by
its own input, so its prompt extends the stored one's and this replica's cache holds that prefix;
any other replica answers it 404, as vLLM does. ``GET /v1/responses/{id}`` returns it. The store
keeps the latest ``STORED_KEPT``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from prefixroute.core import Endpoint
from prefixroute.emulate._errors import InvalidRequest, UnknownResponse
from prefixroute.emulate._openai import (
    DEFAULT_MAX_TOKENS,
    ParsedRequest,
    adapter_of,
    positive,
    salt_of,
    stream_of,
)
from prefixroute.emulate._tokenizer import filler, message_text, render_chat, tokenize

STORED_KEPT = 10_000  # stored responses kept (the latest)

Message = tuple[str, str]  # (role, text)


class ResponseStore:
    """The responses this replica answered: each one's conversation and its last answer."""

    def __init__(self, capacity: int = STORED_KEPT) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[list[Message], dict[str, Any]]] = OrderedDict()

    def put(self, response_id: str, conversation: list[Message], answer: dict[str, Any]) -> None:
        self._kept[response_id] = (conversation, answer)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def conversation(self, response_id: str) -> list[Message]:
        return list(self._get(response_id)[0])

    def answer(self, response_id: str) -> dict[str, Any]:
        return self._get(response_id)[1]

    def _get(self, response_id: str) -> tuple[list[Message], dict[str, Any]]:
        if response_id not in self._kept:  # vLLM's words
            raise UnknownResponse(f"Response with id '{response_id}' not found.", "response_id")
        return self._kept[response_id]


def parse_responses(
    body: object, served_model: str, adapters: tuple[str, ...], store: ResponseStore
) -> tuple[ParsedRequest, list[Message]]:
    """Validate a Responses request; its parse (tokens: the rendered prompt) and the
    conversation to store with its answer (the instructions apart: as OpenAI's, they are not
    carried over to a continuation). Raises InvalidRequest (400), ModelNotFound or
    UnknownResponse (404)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    adapter = adapter_of(body, served_model, adapters)
    stream = stream_of(body)
    limit = positive(body.get("max_output_tokens", DEFAULT_MAX_TOKENS), "max_output_tokens")
    salt = salt_of(body)
    conversation: list[Message] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise InvalidRequest("'previous_response_id' must be a string", "previous_response_id")
        conversation = store.conversation(previous)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string", "instructions")
    conversation += _input(body.get("input"))
    prompt = [("system", instructions), *conversation] if instructions else conversation
    parsed = ParsedRequest(Endpoint.RESPONSES, tokenize(render_chat(prompt)), limit, stream,
                           salt, adapter, include_usage=True)  # fmt: skip
    return parsed, conversation


def _input(items: object) -> list[Message]:
    if isinstance(items, str):
        return [("user", items)]
    if not isinstance(items, list) or not items:
        raise InvalidRequest("'input' must be a string or a non-empty list of items", "input")
    out: list[Message] = []
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
            raise InvalidRequest("each input item must be a message with a 'role'", "input")
        content = item.get("content")
        if isinstance(content, list):  # input_text / output_text parts are text parts
            content = [_as_text(part) for part in content]
        try:
            out.append((item["role"], message_text(content)))
        except ValueError as exc:
            raise InvalidRequest(str(exc), "input") from exc
    return out


def _as_text(part: object) -> object:
    if isinstance(part, Mapping) and part.get("type") in ("input_text", "output_text"):
        return {**part, "type": "text"}
    return part


class ResponsesWriter:
    """Builds one Responses request's answer or stream events (the app's three calls), and
    stores the answer when it ends."""

    def __init__(
        self, parsed: ParsedRequest, model: str, conversation: list[Message], store: ResponseStore
    ) -> None:
        self.parsed = parsed
        self.model = parsed.adapter or model
        self.id = f"resp_{uuid.uuid4().hex[:16]}"
        self.item_id = f"msg_{uuid.uuid4().hex[:16]}"
        self.created = int(time.time())
        self.conversation = conversation
        self.store = store
        self._seq = 0

    def response(self, generated: int, cached_tokens: int, done: bool) -> dict[str, Any]:
        """The response object after ``generated`` tokens (its output and usage once done)."""
        output: list[dict[str, Any]] = []
        if done:
            text = {"type": "output_text", "text": filler(0, generated), "annotations": []}
            output = [{"id": self.item_id, "type": "message", "role": "assistant",
                       "status": "completed", "content": [text]}]  # fmt: skip
        prompt = len(self.parsed.tokens)
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        }
        return {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": "incomplete" if done else "in_progress",
            "incomplete_details": {"reason": "max_output_tokens"} if done else None,
            "output": output, "usage": usage if done else None,
        }  # fmt: skip

    def body(self, generated: int, cached_tokens: int) -> bytes:
        return _dumps(self._stored(generated, cached_tokens)).encode()

    def events(self, start: int, stop: int, cached_tokens: int) -> bytes:
        out: list[str] = []
        if start == 0:
            opening = self.response(0, cached_tokens, done=False)
            out.append(self._event("response.created", {"response": opening}))
            out.append(self._event("response.in_progress", {"response": opening}))
            item = {"id": self.item_id, "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
            out.append(self._event("response.output_item.added", {"item": item, "output_index": 0}))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(self._event("response.content_part.added", self._at(part=part)))
        for i in range(start, stop):
            out.append(self._event("response.output_text.delta", self._at(delta=filler(i, i + 1))))
        return "".join(out).encode()

    def end(self, generated: int, cached_tokens: int, usage: bool) -> bytes:
        final = self._stored(generated, cached_tokens)
        text = filler(0, generated)
        part = {"type": "output_text", "text": text, "annotations": []}
        out = [
            self._event("response.output_text.done", self._at(text=text)),
            self._event("response.content_part.done", self._at(part=part)),
            self._event(
                "response.output_item.done", {"item": final["output"][0], "output_index": 0}
            ),  # fmt: skip
            self._event("response.completed", {"response": final}),
        ]
        return "".join(out).encode()

    def _stored(self, generated: int, cached_tokens: int) -> dict[str, Any]:
        final = self.response(generated, cached_tokens, done=True)
        conversation = [*self.conversation, ("assistant", filler(0, generated))]
        self.store.put(self.id, conversation, final)
        return final

    def _at(self, **fields: object) -> dict[str, object]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0, **fields}

    def _event(self, kind: str, fields: Mapping[str, object]) -> str:
        data = {**fields, "sequence_number": self._seq, "type": kind}
        self._seq += 1
        return f"event: {kind}\ndata: {_dumps(data)}\n\n"


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))
