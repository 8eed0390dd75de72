"""A Responses API request (OpenAI's ``/v1/responses``, which vLLM serves) as chat messages,
so that it is keyed by the same rule as a chat request (:mod:`prefixroute.core.prompt_key`).

The engine renders a Responses request through the model's chat template, ``instructions``
first as the system message, then the ``input``: a string is one user message; a list holds
items, messages among them (``role`` and ``content``, whose parts are ``input_text`` or
``output_text``). So the key is the same messages in the same order, and a client that resends
the whole conversation each turn (no ``previous_response_id``) extends the previous turn's key,
exactly as on ``/v1/chat/completions``:

* ``instructions`` -> ``{"role": "system", "content": instructions}`` (when not empty);
* a message item -> its role, with text parts made chat's ``text`` parts (other parts, an image,
  stay as they are: the key holds their digest);
* any other item (a function call, its output, a reasoning item) -> one message holding the
  item's canonical JSON, as ``tool`` for an output and ``assistant`` otherwise: roles every chat
  template knows, since a tokenizer renders these messages too. Its tokens are not the engine's
  for such items, so in token mode a match stops at the first of them: routing only.

A request that continues a stored response (``previous_response_id``) carries only its new
input; the conversation before it is on the replica that stored it, which is where the front
end sends it (``gateway/_responses.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from prefixroute.core.errors import InvalidPrompt
from prefixroute.core.prompt_key import field_of

TEXT_PARTS = frozenset({"input_text", "output_text", "text"})  # parts that are text
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})  # a tool's answer


def responses_messages(instructions: object, items: object) -> list[Mapping[str, object]]:
    """The chat messages a Responses request's ``instructions`` and ``input`` stand for
    (module docstring); raises InvalidPrompt."""
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidPrompt("'instructions' must be a string")
    messages: list[Mapping[str, object]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if items is None:
        raise InvalidPrompt("'input' is required")
    if isinstance(items, bytes) or not isinstance(items, Sequence) or not items:
        raise InvalidPrompt("'input' must be a string or a non-empty list of items")
    for item in items:
        messages.append(_message(item))
    return messages


def _message(item: object) -> dict[str, object]:
    found, role = field_of(item, "role")
    _, kind = field_of(item, "type")
    if not isinstance(item, Mapping) and not (found or kind is not None):
        raise InvalidPrompt("each input item must be an object")
    if found and kind in (None, "message"):
        if not isinstance(role, str):
            raise InvalidPrompt("an input message's 'role' must be a string")
        return {"role": role, "content": _content(field_of(item, "content")[1])}
    role = "tool" if kind in OUTPUT_ITEMS else "assistant"
    return {"role": role, "content": _canonical(item)}


def _content(content: object) -> object:
    """A message's content with its text parts as chat's ``text`` parts."""
    if not isinstance(content, list):
        return content
    parts: list[object] = []
    for part in content:
        _, kind = field_of(part, "type")
        _, text = field_of(part, "text")
        if kind in TEXT_PARTS and isinstance(text, str):
            parts.append({"type": "text", "text": text})
        else:
            parts.append(part)
    return parts


def _canonical(item: object) -> str:
    if not isinstance(item, Mapping):  # a request model's item: its fields as a mapping
        item = getattr(item, "__dict__", {"item": str(item)})
    return json.dumps(item, sort_keys=True, separators=(",", ":"), default=str)
