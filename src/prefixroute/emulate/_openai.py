"""OpenAI request parsing and response shapes, as vLLM's OpenAI server writes them.

Shapes follow vLLM's ``CompletionResponse`` / ``ChatCompletionResponse`` and their stream
chunks: compact JSON, ``usage`` with ``prompt_tokens_details.cached_tokens`` (what vLLM sends with
``--enable-prompt-tokens-details``). A stream always ends with a usage chunk (``choices: []``)
and ``data: [DONE]``, whatever ``stream_options.include_usage`` says, as vLLM does with
``--enable-force-include-usage`` (``EmulatorConfig.force_usage``, on by default). Without it, as
vLLM by default, only a stream that asks for its usage gets the usage chunk.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixroute.core import Endpoint as Endpoint  # the core's: one name for one call
from prefixroute.core import ModelNotFound
from prefixroute.emulate._errors import InvalidRequest
from prefixroute.emulate._tokenizer import filler, message_text, render_chat, tokenize

DEFAULT_MAX_TOKENS = 16  # output tokens when the request does not say


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    endpoint: Endpoint
    tokens: list[int]  # prompt token ids (chat: the rendered template)
    max_tokens: int  # output length, tokens
    stream: bool
    cache_salt: str | None = None  # vLLM's: salts the prompt's block hashes (tenant isolation)
    adapter: str | None = None  # the LoRA adapter asked for by name (None: the base model)
    include_usage: bool = False  # stream_options.include_usage: the stream asked for its usage


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


def parse_request(
    endpoint: Endpoint, body: object, served_model: str, adapters: tuple[str, ...] = ()
) -> ParsedRequest:
    """Validate a request body; raises InvalidRequest (400) or ModelNotFound (404)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    adapter = adapter_of(body, served_model, adapters)
    if body.get("n") not in (None, 1):
        raise InvalidRequest("only n=1 is supported", param="n")
    stream = stream_of(body)
    max_tokens = body.get("max_tokens")
    if max_tokens is None and endpoint is Endpoint.CHAT:
        max_tokens = body.get("max_completion_tokens")
    max_tokens = positive(DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens, "max_tokens")
    if endpoint is Endpoint.CHAT:
        tokens = tokenize(render_chat(_messages(body.get("messages"))))
    else:
        tokens = _prompt_tokens(body.get("prompt"))
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="prompt")
    salt = salt_of(body)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")
    if options and not stream:  # vLLM's own check and message
        raise InvalidRequest(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    # Usage only when stream_options says include_usage: vLLM 0.32's StreamOptions defaults it
    # to false, so `{}` gets none (generate/base/protocol.py, serve/utils/api_utils.py).
    include_usage = bool(options.get("include_usage")) if options is not None else False
    return ParsedRequest(endpoint, tokens, max_tokens, stream, salt, adapter, include_usage)


def tokenize_answer(
    body: object, served_model: str, window: int, adapters: tuple[str, ...] = ()
) -> dict[str, Any]:
    """vLLM's ``POST /tokenize``: a ``prompt`` string, or chat ``messages`` rendered with the
    generation marker, counted as the replica would; raises InvalidRequest or ModelNotFound."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    adapter_of(body, served_model, adapters)  # an unknown model: 404, as vLLM
    if "messages" in body:
        tokens = tokenize(render_chat(_messages(body.get("messages"))))
    elif isinstance(body.get("prompt"), str):
        tokens = tokenize(str(body["prompt"]))
    else:
        raise InvalidRequest("'prompt' must be a string (or give 'messages')", param="prompt")
    return {"count": len(tokens), "max_model_len": window, "tokens": tokens, "token_strs": None}


def adapter_of(
    body: Mapping[str, object], served_model: str, adapters: tuple[str, ...]
) -> str | None:
    """The LoRA adapter ``body`` names as its model (None: the base model); raises
    ModelNotFound for a model this replica does not serve."""
    model = body.get("model") or None  # "" is no model: vLLM serves its default for it
    if model is not None and model != served_model and model not in adapters:
        raise ModelNotFound(f"The model `{model}` does not exist.")
    return model if model is not None and model != served_model else None


def stream_of(body: Mapping[str, object]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    return stream


def positive(value: object, name: str) -> int:
    """An output limit, field ``name``: a positive integer (InvalidRequest otherwise)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{name}' must be a positive integer", param=name)
    return value


def salt_of(body: Mapping[str, object]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequest(  # vLLM's own check and message
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    return salt


def _messages(raw: object) -> list[tuple[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty list", param="messages")
    out: list[tuple[str, str]] = []
    for msg in raw:
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise InvalidRequest("each message needs a string 'role'", param="messages")
        try:
            out.append((msg["role"], message_text(msg.get("content"))))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc
    return out


def _prompt_tokens(prompt: object) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt
    ):
        return list(prompt)
    raise InvalidRequest(
        "'prompt' must be a string or a list of token ids (one prompt per request)",
        param="prompt",
    )


class ResponseWriter:
    """Builds one request's response body or stream chunks."""

    def __init__(self, parsed: ParsedRequest, model: str) -> None:
        self.parsed = parsed
        self.model = parsed.adapter or model  # vLLM answers with the name it was asked for
        chat = parsed.endpoint is Endpoint.CHAT
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._chat = chat

    def usage(self, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        prompt = len(self.parsed.tokens)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        }

    def _head(self, stream: bool) -> dict[str, Any]:
        if self._chat:
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # --- non-streaming --------------------------------------------------------------------
    def body(self, completion_tokens: int, cached_tokens: int) -> bytes:
        text = filler(0, completion_tokens)
        choice: dict[str, Any]
        if self._chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        out = self._head(stream=False)
        out["choices"] = [choice]
        out["usage"] = self.usage(completion_tokens, cached_tokens)
        out["system_fingerprint"] = None
        return _dumps(out).encode()

    # --- streaming ------------------------------------------------------------------------
    def token_events(self, start: int, stop: int) -> bytes:
        """SSE events for output tokens ``start`` .. ``stop - 1`` (one event per token)."""
        events: list[str] = []
        if self._chat and start == 0:
            events.append(self._chunk({"role": "assistant", "content": ""}, None))
        last = self.parsed.max_tokens - 1
        for i in range(start, stop):
            finish = "length" if i == last else None
            text = filler(i, i + 1)
            events.append(self._chunk({"content": text} if self._chat else text, finish))
        return "".join(events).encode()

    def _chunk(self, delta: dict[str, str] | str, finish: str | None) -> str:
        out = self._head(stream=True)
        if isinstance(delta, dict):
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None}
        choice["finish_reason"] = finish
        choice["stop_reason"] = None
        out["choices"] = [choice]
        return f"data: {_dumps(out)}\n\n"

    def usage_event(self, completion_tokens: int, cached_tokens: int) -> bytes:
        out = self._head(stream=True)
        out["choices"] = []
        out["usage"] = self.usage(completion_tokens, cached_tokens)
        return f"data: {_dumps(out)}\n\n".encode() + self.done_event()

    @staticmethod
    def done_event() -> bytes:
        return b"data: [DONE]\n\n"

    # --- the stream as the app drives it (the same three calls as ``_sglang``'s writer) ------
    def events(self, start: int, stop: int, cached_tokens: int) -> bytes:
        """:meth:`token_events` (OpenAI's chunks carry no counts until the usage chunk)."""
        return self.token_events(start, stop)

    def end(self, generated: int, cached_tokens: int, usage: bool) -> bytes:
        """What ends a finished stream: the usage chunk when ``usage``, then ``[DONE]``."""
        return self.usage_event(generated, cached_tokens) if usage else self.done_event()


def error_event(message: str, err_type: str, code: int) -> bytes:
    """The event vLLM sends when a stream fails after it started, then ``[DONE]``."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": code}}
    return f"data: {_dumps(body)}\n\ndata: [DONE]\n\n".encode()


def models_body(
    model: str, max_model_len: int, created: int, adapters: tuple[str, ...] = ()
) -> dict[str, Any]:
    """vLLM's model list: the base model, then each LoRA adapter with the base as its
    ``parent`` (and its path as ``root``; here its name, and no ``max_model_len``)."""
    cards: list[dict[str, Any]] = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "prefixroute",
            "root": name,
            "parent": None if name == model else model,
            "max_model_len": max_model_len if name == model else None,
        }
        for name in (model, *adapters)
    ]
    return {"object": "list", "data": cards}


def check_window(prompt_tokens: int, window: int, endpoint: Endpoint) -> None:
    """A prompt over the context window gets the engine's own 400 (InvalidRequest): vLLM
    0.32's words for its OpenAI endpoints, SGLang's for ``/generate``. (vLLM 0.32 cuts
    ``max_tokens`` to what the window leaves rather than refusing it.)"""
    if prompt_tokens <= window:
        return
    if endpoint is Endpoint.GENERATE:
        raise InvalidRequest(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length "
            f"({window} tokens)."
        )
    raise InvalidRequest(
        f"This model's maximum context length is {window} tokens. However, your prompt "
        f"contains {prompt_tokens} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt.",
        param="input_tokens",
    )
