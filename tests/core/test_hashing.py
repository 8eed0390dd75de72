"""Tests for prefixroute.core.hashing: chained, full-block, container-independent block hashes."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.core import BlockHash, BlockHasher, ConfigError

# Both block loops: the compiled one (when built) and the Python reference.
BACKENDS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
token_ids = st.integers(min_value=0, max_value=2**32 - 1)
token_lists = st.lists(token_ids, max_size=64)
block_sizes = st.integers(min_value=1, max_value=8)


@BACKENDS
@given(tokens=token_lists, block_size=block_sizes)
def test_only_full_blocks_are_hashed(tokens: list[int], block_size: int, compiled: bool) -> None:
    hashes = BlockHasher(block_size=block_size, compiled=compiled).hash_tokens(tokens)
    assert len(hashes) == len(tokens) // block_size


@given(tokens=token_lists, block_size=block_sizes)
def test_partial_tail_block_does_not_change_hashes(tokens: list[int], block_size: int) -> None:
    hasher = BlockHasher(block_size=block_size)
    full = len(tokens) // block_size * block_size
    assert hasher.hash_tokens(tokens) == hasher.hash_tokens(tokens[:full])


@BACKENDS
@given(
    tokens=st.lists(token_ids, min_size=1, max_size=64),
    block_size=block_sizes,
    data=st.data(),
)
def test_changing_block_i_changes_hash_i_and_all_later_not_earlier(
    tokens: list[int], block_size: int, data: st.DataObject, compiled: bool
) -> None:
    hasher = BlockHasher(block_size=block_size, compiled=compiled)
    n_blocks = len(tokens) // block_size
    if n_blocks == 0:
        return
    pos = data.draw(st.integers(min_value=0, max_value=n_blocks * block_size - 1), label="pos")
    changed = list(tokens)
    changed[pos] = (changed[pos] + 1) % 2**32
    before, after = hasher.hash_tokens(tokens), hasher.hash_tokens(changed)
    i = pos // block_size
    assert before[:i] == after[:i]
    for j in range(i, n_blocks):
        assert before[j] != after[j], f"block {j} kept its hash after block {i} changed"


def test_hash_depends_on_parent_not_only_on_block_content() -> None:
    # The same block content after different prefixes must hash differently (chaining).
    hasher = BlockHasher(block_size=2)
    a = hasher.hash_tokens([1, 2, 5, 6])
    b = hasher.hash_tokens([3, 4, 5, 6])
    assert a[1] != b[1]
    # And identical blocks within one prompt get different hashes at different depths.
    same = hasher.hash_tokens([7, 7, 7, 7, 7, 7])
    assert len(set(same)) == 3


@BACKENDS
@given(tokens=token_lists, block_size=block_sizes)
def test_list_and_numpy_arrays_hash_identically(
    tokens: list[int], block_size: int, compiled: bool
) -> None:
    hasher = BlockHasher(block_size=block_size, compiled=compiled)
    expected = hasher.hash_tokens(tokens)
    assert hasher.hash_tokens(np.array(tokens, dtype=np.uint32)) == expected
    assert hasher.hash_tokens(np.array(tokens, dtype=np.int64)) == expected
    assert hasher.hash_tokens(tuple(tokens)) == expected


def test_numpy_big_endian_array_hashes_like_a_list() -> None:
    hasher = BlockHasher(block_size=2)
    tokens = [1, 2, 3, 70_000]
    assert hasher.hash_tokens(np.array(tokens, dtype=">u4")) == hasher.hash_tokens(tokens)


@BACKENDS
@given(tokens=token_lists, block_size=block_sizes, data=st.data())
def test_known_prefix_reuse_equals_full_hashing(
    tokens: list[int], block_size: int, data: st.DataObject, compiled: bool
) -> None:
    hasher = BlockHasher(block_size=block_size, compiled=compiled)
    cut = data.draw(st.integers(min_value=0, max_value=len(tokens)), label="cut")
    # The earlier turn was a prefix of this one; its hashes are handed in as ``known``.
    known = hasher.hash_tokens(tokens[:cut])
    assert hasher.hash_tokens(tokens, known) == hasher.hash_tokens(tokens)


def test_known_hashes_are_trusted_not_recomputed() -> None:
    # ``known`` is the caller's promise; the new blocks chain on the last known hash.
    hasher = BlockHasher(block_size=1)
    fake = [BlockHash(12345)]
    with_fake = hasher.hash_tokens([1, 2, 3], fake)
    assert with_fake[0] == fake[0]
    assert with_fake[1:] != hasher.hash_tokens([1, 2, 3])[1:]


def test_known_longer_than_prompt_is_truncated_to_its_full_blocks() -> None:
    hasher = BlockHasher(block_size=2)
    long = hasher.hash_tokens(list(range(10)))
    assert hasher.hash_tokens([0, 1, 2, 3, 4], long) == long[:2]


@given(
    tokens=st.lists(token_ids, min_size=1, max_size=32),
    seeds=st.lists(
        st.integers(min_value=0, max_value=2**64 - 1), min_size=2, max_size=2, unique=True
    ),
)
def test_different_seeds_give_disjoint_hashes(tokens: list[int], seeds: list[int]) -> None:
    a = BlockHasher(block_size=1, seed=seeds[0]).hash_tokens(tokens)
    b = BlockHasher(block_size=1, seed=seeds[1]).hash_tokens(tokens)
    assert not set(a) & set(b)


def test_same_seed_is_deterministic() -> None:
    tokens = list(range(100))
    assert BlockHasher(4, seed=7).hash_tokens(tokens) == BlockHasher(4, seed=7).hash_tokens(tokens)


@pytest.mark.parametrize(
    ("text", "block_size", "blocks"),
    [
        ("", 1, 0),
        ("abc", 1, 3),
        ("abcd", 2, 2),
        ("abcde", 2, 2),
        ("héllo", 1, 5),  # é is 2 bytes in UTF-8 but one unit here
        ("日本語テキスト", 2, 3),  # 7 CJK characters
        ("a😀b😀", 2, 2),  # astral-plane emoji count once each
    ],
)
def test_text_mode_counts_characters(text: str, block_size: int, blocks: int) -> None:
    assert len(BlockHasher(block_size=block_size).hash_text(text)) == blocks


@BACKENDS
@given(text=st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40))
def test_text_mode_hashes_one_unit_per_character(text: str, compiled: bool) -> None:
    hasher = BlockHasher(block_size=3, compiled=compiled)
    hashes = hasher.hash_text(text)
    assert len(hashes) == len(text) // 3
    # A non-ASCII character in block i changes block i and later, like a token would.
    if len(text) >= 3:
        changed = "ß" + text[1:] if text[0] != "ß" else "ö" + text[1:]
        assert hasher.hash_text(changed)[0] != hashes[0]


@BACKENDS
@given(text=st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40), data=st.data())
def test_text_known_prefix_reuse_equals_full_hashing(
    text: str, data: st.DataObject, compiled: bool
) -> None:
    hasher = BlockHasher(block_size=2, compiled=compiled)
    cut = data.draw(st.integers(min_value=0, max_value=len(text)), label="cut")
    assert hasher.hash_text(text, hasher.hash_text(text[:cut])) == hasher.hash_text(text)


@pytest.mark.parametrize("block_size", [0, -1, -16])
def test_block_size_below_one_raises_config_error(block_size: int) -> None:
    with pytest.raises(ConfigError, match="block size"):
        BlockHasher(block_size=block_size)


def test_hasher_is_frozen() -> None:
    hasher = BlockHasher()
    with pytest.raises(AttributeError):
        hasher.block_size = 4  # type: ignore[misc]


def test_text_with_a_lone_surrogate_from_json_hashes() -> None:
    import json

    text = json.loads('"ab\\ud800c"')  # JSON allows unpaired \\u escapes
    assert len(BlockHasher(block_size=1).hash_text(text)) == 4


@BACKENDS
@given(head=token_lists, tail=token_lists, block_size=block_sizes)
def test_a_continuation_from_a_parent_extends_the_chain(
    head: list[int], tail: list[int], block_size: int, compiled: bool
) -> None:
    """What an engine event needs: new blocks hashed after a known parent, not from the root."""
    hasher = BlockHasher(block_size=block_size, compiled=compiled)
    whole = head[: len(head) // block_size * block_size]
    first = hasher.hash_tokens(whole)
    rest = hasher.hash_tokens(tail, parent=first[-1] if first else None)
    assert first + rest == hasher.hash_tokens(whole + tail)


def test_parent_none_starts_at_the_seed() -> None:
    hasher = BlockHasher(block_size=2, seed=7)
    assert hasher.hash_tokens([1, 2], parent=None) == hasher.hash_tokens([1, 2])
    assert hasher.hash_tokens([1, 2], parent=BlockHash(7)) == hasher.hash_tokens([1, 2])
    assert hasher.hash_tokens([1, 2], parent=BlockHash(8)) != hasher.hash_tokens([1, 2])


def test_an_adapter_has_its_own_key_space_nested_in_the_seed() -> None:
    """A LoRA adapter's blocks never equal the base model's, another adapter's, or the same
    adapter's under another tenant's seed; a chain continued from a parent stays in its space."""
    base = BlockHasher(4, seed=0)
    tokens = list(range(40))
    plain = base.hash_tokens(tokens)
    a, b = base.for_adapter("a").hash_tokens(tokens), base.for_adapter("b").hash_tokens(tokens)
    tenant_a = BlockHasher(4, seed=11).for_adapter("a").hash_tokens(tokens)
    spaces = [plain, a, b, tenant_a, BlockHasher(4, seed=11).hash_tokens(tokens)]
    assert len({h for space in spaces for h in space}) == 5 * 10  # all disjoint
    assert base.for_adapter("a").hash_tokens(tokens) == a  # deterministic
    assert base.for_adapter("a").block_size == 4
    cont = base.hash_tokens(tokens[20:], parent=a[4])  # any hasher continues a's chain
    assert cont == a[5:]


def test_the_hash_function_is_a_parameter() -> None:
    """Issue 12: the hasher takes its hash function; every block, adapter and salt uses it."""
    calls: list[tuple[bytes, int]] = []

    def fake(data: bytes | memoryview, seed: int) -> int:
        calls.append((bytes(data), seed))
        return seed + 1

    hasher = BlockHasher(2, seed=10, hash_fn=fake)
    assert hasher.hash_tokens([1, 2, 3, 4, 5]) == [11, 12]
    assert calls[0] == ((1).to_bytes(4, "little") + (2).to_bytes(4, "little"), 10)
    assert hasher.hash_text("abcd") == [11, 12]
    assert hasher.salted("s").seed == 11
    assert hasher.for_adapter("a").seed == 11
    assert hasher.salted("s").hash_fn is fake  # derived hashers keep the function
    # The default is xxh3-64, the parent hash as its seed.
    assert BlockHasher().hash_fn is xxhash.xxh3_64_intdigest
    data = bytes(range(8))
    assert BlockHasher(2, seed=5).hash_tokens([0x03020100, 0x07060504]) == [
        xxhash.xxh3_64_intdigest(data, 5)
    ]


def test_a_hash_function_out_of_range_is_refused_where_it_makes_a_seed() -> None:
    hasher = BlockHasher(2, hash_fn=lambda data, seed: -1)
    with pytest.raises(ConfigError, match="hash seed"):
        hasher.salted("s")


def test_a_salt_is_its_own_key_space_composed_with_seed_and_adapter() -> None:
    """``salted`` hashes the salt (UTF-8, lone surrogates kept) into the seed, as the emulated
    engine salts a prompt: salted, unsalted, other salts, other seeds never share a block."""
    base = BlockHasher(4, seed=3)
    salt = "tenant-a\ud800"
    expected = xxhash.xxh3_64_intdigest(salt.encode("utf-8", "surrogatepass"), 3)
    assert base.salted(salt) == BlockHasher(4, seed=expected)
    tokens = list(range(24))
    spaces = [
        base.hash_tokens(tokens),
        base.salted("a").hash_tokens(tokens),
        base.salted("b").hash_tokens(tokens),
        BlockHasher(4, seed=4).salted("a").hash_tokens(tokens),
        base.for_adapter("x").salted("a").hash_tokens(tokens),
        base.salted("a").for_adapter("x").hash_tokens(tokens),
    ]
    assert len({h for space in spaces for h in space}) == 6 * 6  # all disjoint
    assert base.salted("a").block_size == 4
    assert base.salted("a").hash_tokens(tokens) == spaces[1]  # deterministic


@pytest.mark.parametrize("compiled", [True, False])
def test_the_backend_is_not_part_of_a_hashers_identity(compiled: bool) -> None:
    assert BlockHasher(4, compiled=compiled) == BlockHasher(4)
