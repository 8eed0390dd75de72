"""SGLang's native ``/generate``: its request body and its answers, as SGLang's server writes them.

The request carries ``text`` or ``input_ids`` (one of them; a batch is a list of either, and the
emulator, like its OpenAI endpoints, takes a batch of one only), ``sampling_params`` (of which
``max_new_tokens`` matters here; SGLang's default is 128), ``stream``, ``lora_path`` (the LoRA
adapter, by name) and ``extra_key`` (the cache namespace SGLang's OpenAI server fills from
``cache_salt``: requests with different keys share no cached block, as with vLLM's salt).

The answer is ``{"text", "output_ids", "meta_info"}``, with ``meta_info`` holding ``id``,
``finish_reason`` (null until the end, then ``{"type": "length", "length": n}``),
``prompt_tokens``, ``completion_tokens`` and ``cached_tokens``. A stream sends that object after
every token, its ``text`` and ``output_ids`` holding everything generated so far (SGLang's
default; ``--incremental-streaming-output`` sends only the new part), then ``data: [DONE]``.
There is no usage chunk to ask for: every chunk carries its counts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from prefixroute.core import Endpoint
from prefixroute.core.prompt_key import is_token_ids
from prefixroute.emulate._errors import InvalidRequest
from prefixroute.emulate._openai import ParsedRequest
from prefixroute.emulate._tokenizer import filler, tokenize

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


def parse_generate(body: object, adapters: tuple[str, ...] = ()) -> ParsedRequest:
    """Validate a ``/generate`` body; raises InvalidRequest (400)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object")
    text, ids = _one(body.get("text")), _one(body.get("input_ids"))
    if (text is None) == (ids is None):  # SGLang's own check and message
        raise InvalidRequest("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        if not isinstance(text, str):
            raise InvalidRequest("'text' must be a string", param="text")
        tokens = tokenize(text)
    elif is_token_ids(ids):
        assert isinstance(ids, list)
        tokens = list(ids)
    else:
        raise InvalidRequest("'input_ids' must be a list of token ids", param="input_ids")
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="text")
    params = _one(body.get("sampling_params")) or {}
    if not isinstance(params, Mapping):
        raise InvalidRequest("'sampling_params' must be an object", param="sampling_params")
    wanted = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        raise InvalidRequest("'max_new_tokens' must be a positive integer", param="max_new_tokens")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    adapter = _one(body.get("lora_path"))
    if adapter is not None and adapter not in adapters:
        raise InvalidRequest(f"LoRA adapter {adapter!r} is not loaded", param="lora_path")
    key = _one(body.get("extra_key"))
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidRequest("'extra_key' must be a non-empty string", param="extra_key")
    return ParsedRequest(Endpoint.GENERATE, tokens, wanted, stream, key, adapter)


def _one(value: object) -> object:
    """A batch field's only element (a batch of one); a longer batch is refused."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        if len(value) != 1:
            raise InvalidRequest("only one prompt per request is supported")
        return value[0]
    return value


class GenerateWriter:
    """Builds one ``/generate`` request's answer or stream events."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self.parsed = parsed
        self.id = uuid.uuid4().hex  # SGLang's request id (its ``rid``)

    def _answer(self, generated: int, cached_tokens: int, finished: bool) -> dict[str, Any]:
        length = self.parsed.max_tokens
        finish = {"type": "length", "length": length} if finished else None
        meta = {
            "id": self.id,
            "finish_reason": finish,
            "prompt_tokens": len(self.parsed.tokens),
            "completion_tokens": generated,
            "cached_tokens": cached_tokens,
        }
        ids = [_output_id(i) for i in range(generated)]
        return {"text": filler(0, generated), "output_ids": ids, "meta_info": meta}

    def body(self, generated: int, cached_tokens: int) -> bytes:
        return _dumps(self._answer(generated, cached_tokens, finished=True)).encode()

    def events(self, start: int, stop: int, cached_tokens: int) -> bytes:
        """One event per token ``start`` .. ``stop - 1``, each with all the output so far."""
        last = self.parsed.max_tokens
        out = [
            f"data: {_dumps(self._answer(n, cached_tokens, n == last))}\n\n"
            for n in range(start + 1, stop + 1)
        ]
        return "".join(out).encode()

    def end(self, generated: int, cached_tokens: int, usage: bool) -> bytes:
        """What ends a finished stream: ``[DONE]`` (the last token's event said the rest)."""
        return b"data: [DONE]\n\n"


def _output_id(i: int) -> int:
    return 1000 + i % 1000  # stands in for a sampled token id


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))
