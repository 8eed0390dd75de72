"""A deterministic word-level tokenizer for replaying real text.

Pieces are a word or a single punctuation character, each with the whitespace before it attached,
plus trailing whitespace at the very end. Because a piece never extends past a punctuation
character, the tokens of a text that ends in punctuation are a prefix of the tokens of any longer
text that starts with it: ``encode(a + b) == encode(a) + encode(b)`` when ``a`` ends in
punctuation (chat prompts end in ``"Assistant:"``). That is what makes turn k's tokens a prefix of
turn k+1's, as a chat template's per-message tokenization does in a real server.

Ids are xxh3-64 of the piece's UTF-8 bytes modulo 2**32, so equal pieces get equal ids in every
run and process, without a vocabulary file.
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt
import xxhash

from prefixroute.sim.workload import TokenArray

_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+")


class WordTokenizer:
    """Text -> uint32 token ids; remembers ids of pieces it has seen (per instance, no global)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def _id(self, piece: str) -> int:
        tid = self._ids.get(piece)
        if tid is None:
            data = piece.encode("utf-8", "surrogatepass")
            tid = self._ids[piece] = xxhash.xxh3_64_intdigest(data) % 2**32
        return tid

    def encode(self, text: str) -> TokenArray:
        """The token ids of ``text``."""
        return self.encode_with_ends(text)[0]

    def encode_with_ends(self, text: str) -> tuple[TokenArray, npt.NDArray[np.int64]]:
        """Token ids of ``text`` and, for each token, the character offset where its piece ends.

        The offsets let a caller cut the tokens of a prefix of ``text`` without re-tokenizing.
        """
        ids: list[int] = []
        ends: list[int] = []
        for m in _PIECE.finditer(text):
            ids.append(self._id(m.group()))
            ends.append(m.end())
        return np.array(ids, dtype=np.uint32), np.array(ends, dtype=np.int64)
