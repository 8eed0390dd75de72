"""Chained block hashes over token ids or characters, as in vLLM's automatic prefix caching.

Block ``i``'s hash covers its own content and, through its parent's hash, every block before it,
so one dictionary probe per block answers "is this whole prefix cached here". Only full blocks
are hashed: a partial tail block can never be shared exactly.

We chain with xxh3-64 and pass the parent hash as the seed, which costs one C call per block and
no concatenation. 64 bits make an accidental collision in a 1M-block index about 1 in 3e7.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NewType, Protocol

import xxhash

from prefixroute.core.errors import ConfigError

BlockHash = NewType("BlockHash", int)
"""A chained block hash; made only by :class:`BlockHasher`."""

_xxh3 = xxhash.xxh3_64_intdigest
_MAX_TOKEN = 2**32 - 1
_ADAPTER_DOMAIN = b"prefixroute adapter\x00"  # keeps adapter seeds apart from other keyings


class TokenArray(Protocol):
    """A numpy-style array of token ids (anything with ``len`` and ``astype``)."""

    def __len__(self) -> int: ...

    def astype(self, dtype: str) -> Any: ...


TokenIds = Sequence[int] | TokenArray
"""Token ids as a list/tuple or a numpy array; both hash identically."""


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Hashes prompts into chained block hashes.

    ``seed`` is the hash of the empty prefix; tenants that must not share cache entries get
    different seeds (the same role as vLLM's ``cache_salt``).
    """

    block_size: int = 16  # units (tokens or characters) per block
    seed: int = 0  # parent hash of the first block

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"block size must be at least 1, got {self.block_size}")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"hash seed must be in [0, 2**64), got {self.seed}")

    def for_adapter(self, adapter: str) -> BlockHasher:
        """This hasher in ``adapter``'s own key space: a LoRA adapter (served as a model name)
        whose blocks an engine keeps apart from the base model's and every other adapter's,
        as vLLM does by hashing ``lora_name`` into every block. The name is mixed into the
        seed, so it composes with a tenant's seed, and a chain continued from a ``parent``
        stays in the space its parent was hashed in."""
        name = _ADAPTER_DOMAIN + adapter.encode("utf-8", "surrogatepass")
        return BlockHasher(self.block_size, _xxh3(name, self.seed))

    def hash_tokens(
        self,
        tokens: TokenIds,
        known: Sequence[BlockHash] = (),
        *,
        parent: BlockHash | None = None,
    ) -> list[BlockHash]:
        """Hash the full blocks of ``tokens``.

        ``known`` are hashes of this prompt's first blocks computed earlier (the previous turn of
        a conversation); they are trusted, not recomputed, so a new turn hashes only its new blocks.
        ``parent`` continues a chain: ``tokens`` follow the block whose hash it is (an engine's
        KV event names only newly stored blocks and their parent), so
        ``hash_tokens(b, parent=hash_tokens(a)[-1]) == hash_tokens(a + b)[len(a) // size:]``
        when ``a`` is whole blocks.
        """
        # Token ids are hashed as little-endian uint32 whatever container holds them, so a list
        # and a numpy array of the same ids give the same hashes.
        astype = getattr(tokens, "astype", None)
        try:
            if astype is None:
                data = array("I", tokens).tobytes()  # type: ignore[arg-type]
            else:
                if len(tokens) and (tokens.min() < 0 or tokens.max() > _MAX_TOKEN):  # type: ignore[union-attr]
                    raise OverflowError
                data = astype("<u4").tobytes()
        except (OverflowError, TypeError) as exc:
            raise ConfigError("token ids must be integers in [0, 2**32)") from exc
        return self._hash_bytes(memoryview(data), len(tokens), 4, known, parent)

    def hash_text(self, text: str, known: Sequence[BlockHash] = ()) -> list[BlockHash]:
        """Hash the full blocks of ``text``, one unit per character (UTF-32 keeps width fixed)."""
        # surrogatepass: JSON may carry lone surrogates ("\ud800"); they hash, they don't fail.
        data = text.encode("utf-32-le", "surrogatepass")
        return self._hash_bytes(memoryview(data), len(text), 4, known)

    def _hash_bytes(
        self,
        data: memoryview,
        units: int,
        width: int,
        known: Sequence[BlockHash],
        parent: BlockHash | None = None,
    ) -> list[BlockHash]:
        n_blocks = units // self.block_size
        step = self.block_size * width
        out: list[BlockHash] = list(known[:n_blocks])
        chain: int = out[-1] if out else (self.seed if parent is None else parent)
        for start in range(len(out) * step, n_blocks * step, step):
            chain = _xxh3(data[start : start + step], chain)
            out.append(BlockHash(chain))
        return out
