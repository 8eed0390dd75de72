"""One request as the router keys it: read once, the same way by every front end.

The gateway and the Envoy endpoint picker hold a request as the parsed JSON object of
``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``, Anthropic's ``/v1/messages``
(:mod:`prefixroute.core.messages_input`) or SGLang's native ``/generate``; the Ray Serve router
holds Ray LLM's request model, with the same fields as attributes. :func:`key_of` reads either
(through :func:`~prefixroute.core.prompt_key.field_of`) into one :class:`RouteKey`, and
:meth:`RouteKey.view` turns the key into the router's :class:`RequestView`, so the choice between
text and token ids is written once.

What is read: the routing text or token ids (the rules are :mod:`prefixroute.core.prompt_key`'s:
chat messages in order with their roles, a prompt string, or token ids), how many prompts (a
batch keys on its first) and choices per prompt (``n``) it asks for, ``model``, ``stream``,
the requested output length (``max_tokens``, else ``max_completion_tokens``: a hint for the
load view, so an unusable value reads as 0), and vLLM's ``add_special_tokens``. ``/generate``
has its own names for these (:func:`_generate_key`), and names its LoRA adapter itself. What the
front end adds later, without reading the request again: the tenant and its hash seed (tenant
isolation) and the LoRA adapter the model names (the replica registry knows which).

A request that cannot be keyed raises :class:`~prefixroute.core.errors.InvalidPrompt`, which
each front end translates into its own error (HTTP 400, a failed Serve request).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from prefixroute.core.errors import InvalidPrompt
from prefixroute.core.messages_input import anthropic_messages
from prefixroute.core.prompt_key import chat_text, field_of, lax_bool, prompt_key, prompts_in
from prefixroute.core.responses_input import responses_messages
from prefixroute.core.types import RequestView

if TYPE_CHECKING:
    from prefixroute.core.router import Router


# Output lengths and choices are hints for the load view, and the replica judges the request
# itself (vLLM refuses a max_tokens past its context window). Unbounded, a client's 2**64 or
# 10**400 broke what carries them: the sync wire (an int64), float costs, the load's token
# sums, each time after the request was counted in flight (security audit, 2026-12-07).
MAX_OUTPUT_HINT = 1 << 24  # tokens: far past any context window
MAX_CHOICES_HINT = 1 << 16  # sequences per prompt


class Endpoint(StrEnum):
    """Which call a request is: OpenAI's, or SGLang's native one (values are stable: metric
    labels)."""

    COMPLETIONS = "completions"
    CHAT = "chat_completions"
    GENERATE = "generate"  # SGLang's native /generate: text or input_ids, sampling_params
    RESPONSES = "responses"  # OpenAI's Responses API: instructions and input items
    MESSAGES = "messages"  # Anthropic's Messages API (vLLM serves it): system and messages
    OTHER = "other"  # any other /v1/* call: routed on load alone


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What the router needs from one request; exactly one of ``text`` and ``tokens`` is set
    once keyed (``text=""`` for a call routed on load alone)."""

    text: str | None  # routing text (character mode); None when routing on token ids
    tokens: list[int] | None  # prompt token ids (token mode)
    model: str | None = None  # requested model; None = any replica
    stream: bool = False  # the client asked for an SSE stream
    max_tokens: int = 0  # requested output length, tokens (0 when not given)
    messages: list[Mapping[str, object]] | None = None  # chat messages, for a tokenizer
    add_special_tokens: bool | None = None  # vLLM's request field; None = the endpoint default
    tenant: str | None = None  # the tenant that sent it (None: no tenancy)
    seed: int | None = None  # the tenant's own hash seed under isolation (None: the common one)
    adapter: str | None = None  # the LoRA adapter ``model`` names (None: a base model)
    prompts: int = 1  # prompts in the request: a batch is keyed on its first
    choices: int = 1  # sequences generated per prompt (``n``; ``best_of`` when larger)
    # The stored response a Responses request continues (``previous_response_id``): the
    # replica that stored it holds the conversation before it (core/responses_input.py).
    continues: str | None = None

    def view(self, router: Router, request_id: str) -> RequestView:
        """The router's view of this request: its prompt hashed once, in the key space of its
        seed and adapter."""
        text = None if self.tokens is not None else self.text or ""
        view = router.view(
            request_id, tokens=self.tokens, text=text, output_tokens=self.max_tokens,
            model=self.model, tenant=self.tenant, seed=self.seed, adapter=self.adapter,
            sequences=self.prompts * self.choices, batch=self.prompts > 1,
        )  # fmt: skip
        # A continuation: the replica prepends the stored conversation (RequestView.extended).
        return view if self.continues is None else dataclasses.replace(view, extended=True)


EMPTY_KEY = RouteKey("", None)  # no body: route on load alone, among all replicas


def key_of(endpoint: Endpoint, request: object) -> RouteKey:
    """The key of ``request`` (a mapping, or an object with the fields as attributes) sent to
    ``endpoint``; raises InvalidPrompt."""
    _, model = field_of(request, "model")
    if model is not None and not isinstance(model, str):
        raise InvalidPrompt("'model' must be a string")
    stream = lax_bool(field_of(request, "stream")[1]) is True  # "stream": 1 streams
    max_tokens = _max_tokens(request)
    _, special = field_of(request, "add_special_tokens")
    special = special if isinstance(special, bool) else None
    choices = _choices(request)
    if endpoint is Endpoint.CHAT:
        _, messages = field_of(request, "messages")
        chat = chat_text(messages)  # validates: a non-empty list of messages
        return RouteKey(chat, None, model, stream, max_tokens, _mappings(messages),
                        special, choices=choices)  # fmt: skip
    if endpoint is Endpoint.COMPLETIONS:
        _, prompt = field_of(request, "prompt")
        text, tokens = prompt_key(prompt)
        return RouteKey(text, tokens, model, stream, max_tokens, None, special,
                        prompts=prompts_in(prompt), choices=choices)  # fmt: skip
    if endpoint is Endpoint.GENERATE:
        return _generate_key(request, model, stream)
    if endpoint is Endpoint.RESPONSES:
        return _responses_key(request, model, stream)
    if endpoint is Endpoint.MESSAGES:
        _, system = field_of(request, "system")
        messages = anthropic_messages(system, field_of(request, "messages")[1])
        return RouteKey(chat_text(messages), None, model, stream, max_tokens, messages)
    return RouteKey("", None, model, stream, max_tokens)


def _choices(request: object, names: tuple[str, ...] = ("n", "best_of")) -> int:
    """Sequences generated per prompt: the largest usable of ``names`` (at least 1)."""
    values = [field_of(request, name)[1] for name in names]
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 1]
    return min(max(counts, default=1), MAX_CHOICES_HINT)


def _generate_key(request: object, model: str | None, stream: bool) -> RouteKey:
    """SGLang's ``/generate``: ``text`` or ``input_ids`` (one of them; of a batch the first
    decides, as for completions), ``sampling_params.max_new_tokens`` and the ``lora_path``
    adapter, whose blocks the engine keeps apart from the base model's. A request carrying
    only ``input_embeds`` has no prefix to key: it routes on load alone. ``model`` is no field
    of SGLang's; a client may still send it to pick among a fleet's models."""
    _, text = field_of(request, "text")
    _, ids = field_of(request, "input_ids")
    if text is not None and ids is not None:
        raise InvalidPrompt("give 'text' or 'input_ids', not both")
    params = _first(field_of(request, "sampling_params")[1])
    max_tokens = _max_tokens(params, ("max_new_tokens",))
    adapter = _first(field_of(request, "lora_path")[1])
    adapter = adapter if isinstance(adapter, str) and adapter else None
    if text is None and ids is None:
        if field_of(request, "input_embeds")[1] is None:
            raise InvalidPrompt("'text' or 'input_ids' is required")
        return RouteKey("", None, model, stream, max_tokens, adapter=adapter)
    named, prompt = ("text", text) if text is not None else ("input_ids", ids)
    try:
        key_text, tokens = prompt_key(prompt)
    except InvalidPrompt:
        key_text = tokens = None
    if (key_text if named == "text" else tokens) is None:  # also: ids as text, text as ids
        raise InvalidPrompt(_GENERATE_PROMPTS[named])
    return RouteKey(key_text, tokens, model, stream, max_tokens, adapter=adapter,
                    prompts=prompts_in(prompt), choices=_choices(params, ("n",)))  # fmt: skip


def _responses_key(request: object, model: str | None, stream: bool) -> RouteKey:
    """OpenAI's ``/v1/responses``: keyed as the chat messages its ``instructions`` and
    ``input`` stand for (:mod:`prefixroute.core.responses_input`), ``max_output_tokens``, and
    the stored response it continues, if any."""
    _, instructions = field_of(request, "instructions")
    messages = responses_messages(instructions, field_of(request, "input")[1])
    _, continues = field_of(request, "previous_response_id")
    if continues is not None and (not isinstance(continues, str) or not continues):
        raise InvalidPrompt("'previous_response_id' must be a non-empty string")
    max_tokens = _max_tokens(request, ("max_output_tokens",))
    return RouteKey(chat_text(messages), None, model, stream, max_tokens, messages,
                    continues=continues)  # fmt: skip


_GENERATE_PROMPTS = {  # what each /generate prompt field must be
    "text": "'text' must be a string or a list of strings",
    "input_ids": "'input_ids' must be a list of token ids or a list of such lists",
}


def _first(value: object) -> object:
    """A batch field's first element (SGLang takes a list per prompt), else the value."""
    return value[0] if isinstance(value, list) and value else value


def _mappings(messages: object) -> list[Mapping[str, object]] | None:
    """``messages`` when a tokenizer can read them: a list of mappings, as a JSON body has
    (a request model's messages are objects, and only the routing text is kept of them)."""
    if isinstance(messages, list) and all(isinstance(m, Mapping) for m in messages):
        return messages
    return None


def _max_tokens(
    request: object, names: tuple[str, ...] = ("max_tokens", "max_completion_tokens")
) -> int:
    # A request model may carry both fields with one left None: the first usable one counts.
    for name in names:
        _, value = field_of(request, name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return min(value, MAX_OUTPUT_HINT)
    return 0  # only a hint for the load view
