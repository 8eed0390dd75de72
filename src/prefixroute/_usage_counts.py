"""Token counts in an answer's ``usage``, whatever API wrote it: read by the gateway (what the
router learns from) and by the load generator (what it reports), one reader for both.

OpenAI's ``usage`` (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``), the Responses API's (``input_tokens``,
``output_tokens``, ``input_tokens_details.cached_tokens``), Anthropic's Messages API's (its
split: :func:`_anthropic`) and SGLang's ``/generate`` ``meta_info``. A count a report leaves out
is None, and a later report fills only what it gives (:func:`merged`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Anthropic's Messages API: a whole answer (``"type": "message"``) and the two stream events
# that carry usage (the opening one's in its message, the closing delta's its own).
ANTHROPIC_USAGE = frozenset({"message", "message_start", "message_delta"})


@dataclass(frozen=True, slots=True)
class Usage:
    """A response's token counts (each None when the replica did not report it)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None

    def __post_init__(self) -> None:
        # No engine finds more of a prompt cached than the prompt: a replica that says so is
        # believed up to the prompt (its word against the router's prediction, not more).
        prompt, cached = self.prompt_tokens, self.cached_tokens
        if prompt is not None and cached is not None and cached > prompt:
            object.__setattr__(self, "cached_tokens", prompt)


# A count past this is no request's (context windows are millions of tokens at most): a replica
# that reports one is not believed. Twelve answers of 1e30 tokens once took the model's learned
# characters per token to its floor (every prompt then counted 16x) and the token counters,
# which never go down, to 6e30.
MAX_TOKENS = 2**31 - 1


def _count(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def usage_of(obj: object) -> Usage | None:
    """The usage in a parsed response or stream chunk, or None when it has none: OpenAI's
    ``usage``, the Responses API's (``input_tokens``, ``output_tokens`` and
    ``input_tokens_details.cached_tokens``, in the response or, streamed, in the response that
    ``response.completed`` carries), Anthropic's (:func:`_anthropic`, in a ``message``, a
    stream's ``message_start`` and ``message_delta``), or the ``meta_info`` of SGLang's
    ``/generate`` (``prompt_tokens``, ``completion_tokens`` and ``cached_tokens``, in every chunk
    of a stream)."""
    if not isinstance(obj, Mapping):
        return None
    usage = obj.get("usage")
    if usage is None and isinstance(obj.get("response"), Mapping):  # a Responses stream event
        usage = obj["response"].get("usage")
    kind = obj.get("type")
    if kind in ANTHROPIC_USAGE:
        if kind == "message_start" and isinstance(obj.get("message"), Mapping):
            usage = obj["message"].get("usage")
        return _anthropic(usage) if isinstance(usage, Mapping) else None
    if not isinstance(usage, Mapping):
        meta = obj.get("meta_info")
        if isinstance(meta, Mapping) and "prompt_tokens" in meta:
            return Usage(
                _count(meta.get("prompt_tokens")),
                _count(meta.get("completion_tokens")),
                _count(meta.get("cached_tokens")),
            )
        return None
    if "input_tokens" in usage:  # the Responses API's names
        details = usage.get("input_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        return Usage(_count(usage.get("input_tokens")), _count(usage.get("output_tokens")), cached)
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    return Usage(
        _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")), cached
    )


def _anthropic(usage: Mapping[str, object]) -> Usage:
    """Anthropic's counts: ``input_tokens`` is the prompt *less* what was read from the cache
    (``cache_read_input_tokens``) and written to it (``cache_creation_input_tokens``), vLLM's
    ``prompt_tokens`` less its cached tokens; the prompt is their sum."""
    fresh = _count(usage.get("input_tokens"))
    read = _count(usage.get("cache_read_input_tokens"))
    written = _count(usage.get("cache_creation_input_tokens")) or 0
    prompt = None if fresh is None else fresh + (read or 0) + written
    return Usage(prompt, _count(usage.get("output_tokens")), read)


def merged(last: Usage, earlier: Usage) -> Usage:
    """``last``, its missing counts taken from ``earlier`` (Anthropic's closing
    ``message_delta`` may give only the output tokens, its ``message_start`` the prompt's)."""
    return Usage(
        last.prompt_tokens if last.prompt_tokens is not None else earlier.prompt_tokens,
        last.completion_tokens if last.completion_tokens is not None else earlier.completion_tokens,
        last.cached_tokens if last.cached_tokens is not None else earlier.cached_tokens,
    )
