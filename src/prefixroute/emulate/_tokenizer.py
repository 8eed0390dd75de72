"""A small deterministic word-level tokenizer and chat template for the emulated replica.

Real tokenizers would make the emulator depend on model files; routing only needs two properties
of them, and this one has both exactly:

* **Prefix-stable.** Each token is one whitespace-led piece (``" word"`` or ``" ,"``), so a text
  that extends another at a piece boundary has a token list that extends the other's. A prompt
  written as ``"w1 w2 w3"`` is exactly three tokens, which makes prefill counts easy to check.
* **Deterministic ids.** A token id is the xxh32 of its piece: the same text always gives the
  same ids, in every process, so two replicas hash a shared prefix identically.

The chat template puts a space after every role marker and before every end marker, so a
conversation's next prompt (previous messages + the reply + a new user message) extends the
previous prompt (which ended with the bare ``<|assistant|>`` generation marker) token for token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

# A word or one punctuation character, each with the whitespace before it; a trailing run of
# whitespace (end of text) is a piece of its own.
_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")
_xxh32 = xxhash.xxh32_intdigest

# Words the emulator "generates", cycled in order: deterministic and one token each.
FILLER_WORDS = (
    "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do",
    "eiusmod", "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna", "aliqua", "enim",
)  # fmt: skip


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``: one id per whitespace-led word or punctuation piece."""
    return [_xxh32(piece.encode()) for piece in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def filler(start: int, stop: int) -> str:
    """Generated text for output tokens ``start`` .. ``stop - 1`` (each one word, one token)."""
    n = len(FILLER_WORDS)
    return "".join(" " + FILLER_WORDS[i % n] for i in range(start, stop))


def message_text(content: object) -> str:
    """The text of a chat message's ``content``: a string, or the text parts of a part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise ValueError("each content part must be an object with a 'type'")
            if part["type"] == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError("a text content part needs a string 'text'")
                texts.append(text)
        return "".join(texts)
    raise ValueError("message content must be a string, a list of parts or null")


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """The prompt for ``(role, text)`` messages, ending with the assistant generation marker."""
    parts = [f"<|{role}|> {text} <|end|>\n" for role, text in messages]
    parts.append("<|assistant|>")
    return "".join(parts)


class EmulatedTokenizer:
    """This tokenizer and chat template as a gateway tokenizer (``Gateway(..., tokenizer=)``):
    the gateway then keys requests by exactly the token ids the emulated replicas compute, as
    it would with a real model's tokenizer in front of vLLM (precise mode, token mode)."""

    def encode_prompt(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return tokenize(text)

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_special_tokens: bool = False
    ) -> list[int]:
        pairs = ((str(m["role"]), str(m.get("content") or "")) for m in messages)
        return tokenize(render_chat(pairs))
