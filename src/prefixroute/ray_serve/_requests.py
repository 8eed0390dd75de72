"""Request objects for the emulated Serve replica, readable by both Ray's router and ours.

Ray's ``PrefixCacheAffinityRouter`` finds the prompt through an argument's ``messages`` or
``prompt`` *attribute* (dicts are not read), as Ray LLM's request models carry them. So these
are two classes, not one with optional fields: an object with ``messages = None`` would make
Ray's router route on an empty string. Our router also reads plain dicts with those keys.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """An OpenAI-style chat request: ``[{"role": ..., "content": ...}, ...]``."""

    messages: list[dict[str, str]]  # the conversation so far, oldest first
    max_tokens: int = 16  # output length, tokens


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """A completion request: a prompt string or its token ids."""

    prompt: str | list[int]
    max_tokens: int = 16  # output length, tokens
