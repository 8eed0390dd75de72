"""The routing key of a Serve request, read from its arguments the way Ray's prefix router does.

Ray's ``PrefixCacheAffinityRouter`` takes the first positional argument that has a ``messages``
or a ``prompt`` attribute (Ray LLM's request models have them). We look in the same place, so
one deployment runs under either router unchanged, and also accept a mapping with those keys
(a plain JSON body passed through a handle) and keyword arguments after the positional ones.

The key itself is the gateway's (:mod:`prefixroute.core.prompt_key`): chat messages in order, roles
included, one ``"role: content\\n"`` per message, so a conversation's next turn extends the
previous turn's key block for block; a prompt string is its own key; a prompt of token ids is
routed on the ids; of a batch of prompts the first decides. Ray's router drops the roles; we
keep them, because two conversations that differ only in who said what are different prefixes
to the engine's chat template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefixroute.core import prompt_key
from prefixroute.core.prompt_key import field_of
from prefixroute.ray_serve._errors import UnroutableRequest

FIELDS = ("messages", "prompt")  # looked up in this order, in each argument (as Ray does)


@dataclass(frozen=True, slots=True)
class RouteKey:
    text: str | None  # routing text (character mode); None when routing on token ids
    tokens: list[int] | None  # prompt token ids (token mode)
    max_tokens: int  # requested output length, tokens (0 when not given)


def route_key(args: Sequence[object], kwargs: Mapping[str, object]) -> RouteKey:
    """The key of the first argument with ``messages`` or ``prompt``; raises UnroutableRequest."""
    for arg in (*args, *kwargs.values()):
        for name in FIELDS:
            found, value = field_of(arg, name)
            if not found or value is None:  # a request model may carry both, one left None
                continue
            max_tokens = _max_tokens(arg)
            if name == "messages":
                return RouteKey(chat_text(value), None, max_tokens)
            text, tokens = _prompt(value)
            return RouteKey(text, tokens, max_tokens)
    raise UnroutableRequest(
        "prefixroute: no argument of this request has 'messages' or 'prompt' (as an attribute "
        "or a key), so there is nothing to route on; pass the request object (or a dict) that "
        "carries them as an argument of the handle call"
    )


def chat_text(messages: object) -> str:
    """``"role: content\\n"`` per message, in order (see :mod:`prefixroute.core.prompt_key`)."""
    try:
        return prompt_key.chat_text(messages)
    except prompt_key.InvalidPrompt as exc:
        raise UnroutableRequest(f"prefixroute: {exc}") from None


def _prompt(prompt: object) -> tuple[str | None, list[int] | None]:
    try:
        return prompt_key.prompt_key(prompt)
    except prompt_key.InvalidPrompt as exc:
        raise UnroutableRequest(f"prefixroute: {exc}") from None


def _max_tokens(arg: object) -> int:
    for name in ("max_tokens", "max_completion_tokens"):
        _, value = field_of(arg, name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0  # only a hint for the load view
