"""An Anthropic Messages request (``/v1/messages``, which vLLM serves beside the OpenAI API) as
chat messages, so that it is keyed by the same rule as a chat request
(:mod:`prefixroute.core.prompt_key`).

vLLM renders such a request through the model's chat template after turning it into OpenAI
chat messages (``vllm/entrypoints/anthropic/serving.py``), and the key follows the same turns:

* ``system`` (a string, or text blocks) -> one system message, its texts joined, first;
* a message -> its role, its content a string as it is, or blocks: text blocks become chat's
  ``text`` parts (a single one, the string itself, as vLLM sends it), other blocks (an image,
  a tool call, a tool's result, thinking) stay as they are and the key holds their digest;
* an inline ``system`` message -> a system message of its text.

Two things vary from request to request without changing what the engine computes, so they
are left out of the key: ``cache_control`` markers (Anthropic's prompt-caching hints, which
clients such as Claude Code move to the newest turn every request) and Claude Code's
attribution block, a system text beginning ``x-anthropic-billing-header`` that carries a hash
per request: vLLM drops it for the same reason (it "defeats prefix caching"). Kept in, each
would make every turn of a conversation a new prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixroute.core.errors import InvalidPrompt
from prefixroute.core.prompt_key import field_of

BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request system text
HINTS = frozenset({"cache_control"})  # block fields that do not change the prompt


def anthropic_messages(system: object, messages: object) -> list[Mapping[str, object]]:
    """The chat messages an Anthropic request's ``system`` and ``messages`` stand for (module
    docstring); raises InvalidPrompt."""
    out: list[Mapping[str, object]] = []
    if system is not None:
        text = _system_text(system, "'system' must be a string or a list of text blocks")
        if text:
            out.append({"role": "system", "content": text})
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidPrompt("'messages' must be a non-empty list")
    for message in messages:
        found, role = field_of(message, "role")
        if not isinstance(message, Mapping) and not found:
            raise InvalidPrompt("each message must be an object")
        if not isinstance(role, str):
            raise InvalidPrompt("a message's 'role' must be a string")
        content = field_of(message, "content")[1]
        if role == "system":
            text = _system_text(content, "a system message's content must be text")
            if text:
                out.append({"role": "system", "content": text})
            continue
        out.append({"role": role, "content": _content(content)})
    return out


def _system_text(value: object, problem: str) -> str:
    """A system prompt's text: a string, or its text blocks joined, less the attribution."""
    if isinstance(value, str):
        return "" if value.startswith(BILLING_HEADER) else value
    if isinstance(value, bytes) or not isinstance(value, Sequence):
        raise InvalidPrompt(problem)
    texts = []
    for block in value:
        _, kind = field_of(block, "type")
        _, text = field_of(block, "text")
        if kind != "text" or not isinstance(text, str):
            raise InvalidPrompt(problem)
        if text and not text.startswith(BILLING_HEADER):
            texts.append(text)
    return "".join(texts)


def _content(content: object) -> object:
    """A message's content as chat content: text blocks as ``text`` parts (one alone: its
    string), other blocks without their caching hints."""
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, bytes) or not isinstance(content, Sequence):
        raise InvalidPrompt("a message's 'content' must be a string or a list of blocks")
    parts: list[object] = []
    for block in content:
        _, kind = field_of(block, "type")
        _, text = field_of(block, "text")
        if kind == "text" and isinstance(text, str):
            parts.append({"type": "text", "text": text})
        elif isinstance(block, Mapping):
            parts.append({k: v for k, v in block.items() if k not in HINTS})
        else:
            parts.append(block)
    if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "text":
        return parts[0]["text"]
    return parts
