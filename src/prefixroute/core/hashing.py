"""Chained block hashes over token ids or characters, as in vLLM's automatic prefix caching.

Block ``i``'s hash covers its own content and, through its parent's hash, every block before it,
so one dictionary probe per block answers "is this whole prefix cached here". Only full blocks
are hashed: a partial tail block can never be shared exactly.

We chain with xxh3-64 and pass the parent hash as the seed, which costs one C call per block and
no concatenation. 64 bits make an accidental collision in a 1M-block index about 1 in 3e7.
The hash function is a parameter (:class:`BlockHasher`); with the default, the block loop runs
in the compiled hot path when it is built (:mod:`prefixroute.core._native`), which gives the
same hashes as the Python loop in :meth:`BlockHasher._hash_bytes`, the reference.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NewType, Protocol, cast

import xxhash

from prefixroute.core import _native
from prefixroute.core.errors import ConfigError

BlockHash = NewType("BlockHash", int)
"""A chained block hash; made only by :class:`BlockHasher`."""

HashFn = Callable[[bytes | memoryview, int], int]
"""``(data, seed) -> hash``: a seeded 64-bit hash; the seed is the parent block's hash."""

xxh3_64: HashFn = xxhash.xxh3_64_intdigest
"""The default hash function, the only one the compiled block loop implements."""

_MAX_TOKEN = 2**32 - 1
_ADAPTER_DOMAIN = b"prefixroute adapter\x00"  # keeps adapter seeds apart from other keyings


class TokenArray(Protocol):
    """A numpy-style array of token ids (anything with ``len`` and ``astype``)."""

    def __len__(self) -> int: ...

    def astype(self, dtype: str) -> Any: ...


TokenIds = Sequence[int] | TokenArray
"""Token ids as a list/tuple or a numpy array; both hash identically."""


MAX_BLOCK_SIZE = 1 << 20  # units per block: far past any engine's block or routing grain


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Hashes prompts into chained block hashes.

    ``seed`` is the hash of the empty prefix; tenants that must not share cache entries get
    different seeds (the same role as vLLM's ``cache_salt``: :meth:`salted`). ``hash_fn`` must
    return ints in ``[0, 2**64)``, as the index's compiled LRU keys on them.
    """

    block_size: int = 16  # units (tokens or characters) per block
    seed: int = 0  # parent hash of the first block
    hash_fn: HashFn = xxh3_64  # (block bytes, parent hash) -> block hash
    # False: always the Python block loop (the reference); True: the compiled one when it is
    # built and hash_fn is the default. Both give the same hashes: not part of its identity.
    compiled: bool = dataclasses.field(default=True, compare=False, repr=False)

    def __post_init__(self) -> None:
        # At most MAX_BLOCK_SIZE: one of 10**20 characters started, then failed every request
        # (an int past a C ssize_t in the hashing).
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(f"block size must be 1 to {MAX_BLOCK_SIZE:,}, got {self.block_size}")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"hash seed must be in [0, 2**64), got {self.seed}")

    def for_adapter(self, adapter: str) -> BlockHasher:
        """This hasher in ``adapter``'s own key space: a LoRA adapter (served as a model name)
        whose blocks an engine keeps apart from the base model's and every other adapter's,
        as vLLM does by hashing ``lora_name`` into every block. The name is mixed into the
        seed, so it composes with a tenant's seed, and a chain continued from a ``parent``
        stays in the space its parent was hashed in."""
        name = _ADAPTER_DOMAIN + adapter.encode("utf-8", "surrogatepass")
        return dataclasses.replace(self, seed=self.hash_fn(name, self.seed))

    def salted(self, salt: str) -> BlockHasher:
        """This hasher in the key space of ``salt`` (vLLM's ``cache_salt``): the salt is hashed
        into the seed, so salted hashes never meet unsalted ones or another salt's, and it
        composes with :meth:`for_adapter` and with a tenant's seed as that method does. The
        salt is hashed as it is, with no domain prefix: the emulated engine's own salting."""
        data = salt.encode("utf-8", "surrogatepass")
        return dataclasses.replace(self, seed=self.hash_fn(data, self.seed))

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
        try:
            data = self._packed(tokens)
        except (OverflowError, TypeError) as exc:
            raise ConfigError("token ids must be integers in [0, 2**32)") from exc
        return self._hash_bytes(memoryview(data), len(tokens), 4, known, parent)

    def _packed(self, tokens: TokenIds) -> bytes:
        """Token ids as little-endian uint32, whatever container holds them, so a list and a
        numpy array of the same ids hash alike; OverflowError or TypeError for a bad id."""
        # The compiled packer reads lists and integer arrays in one pass and answers None for
        # what it does not take. Mutation testing runs with it off, so these lines are
        # pinned by tests/core/test_native.py instead.
        pack = _native.pack_u32 if self.compiled else None  # pragma: no mutate
        packed = None if pack is None else pack(tokens)  # pragma: no mutate
        if packed is not None:  # pragma: no mutate
            return packed  # pragma: no mutate
        astype = getattr(tokens, "astype", None)
        if astype is None:
            # bytes hold one id per byte: array() alone would read them as raw uint32 memory
            ids = list(tokens) if isinstance(tokens, bytes | bytearray) else tokens
            return array("I", ids).tobytes()  # type: ignore[arg-type]
        if len(tokens) and (tokens.min() < 0 or tokens.max() > _MAX_TOKEN):  # type: ignore[union-attr]
            raise OverflowError
        return astype("<u4").tobytes()  # type: ignore[no-any-return]

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
        # The same loop in C, for the default hash function; its ints are BlockHashes (a NewType
        # is an int at run time). Off under mutation testing: tests/core/test_native.py pins it.
        native = _native.chain_xxh3 if self.hash_fn is xxh3_64 else None  # pragma: no mutate
        if native is not None and self.compiled:  # pragma: no mutate
            hashes = native(data, step, len(out), n_blocks, chain)  # pragma: no mutate
            return out + cast(list[BlockHash], hashes)  # pragma: no mutate
        hash_fn = self.hash_fn
        for start in range(len(out) * step, n_blocks * step, step):
            chain = hash_fn(data[start : start + step], chain)
            out.append(BlockHash(chain))
        return out
