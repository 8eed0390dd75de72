"""BlockHasher at its documented edges (core/hashing.py, docs/mutation.md): the seed's range,
token ids outside uint32 in any container, and names and text that carry lone surrogates."""

from __future__ import annotations

import numpy as np
import pytest

from prefixroute.core import BlockHasher, ConfigError


def test_the_seed_is_a_64_bit_unsigned_integer() -> None:
    BlockHasher(4, seed=2**64 - 1)
    with pytest.raises(ConfigError) as info:
        BlockHasher(4, seed=2**64)
    assert str(info.value) == f"hash seed must be in [0, 2**64), got {2**64}"


@pytest.mark.parametrize(
    "ids",
    [[-1, 5], [5, 2**32], np.array([-1, 5]), np.array([5, 2**32]), np.array([-1, 2**32])],
    ids=["list-negative", "list-large", "array-negative", "array-large", "array-both"],
)
def test_token_ids_outside_uint32_are_refused_in_any_container(ids: object) -> None:
    with pytest.raises(ConfigError) as info:
        BlockHasher(1).hash_tokens(ids)  # type: ignore[arg-type]
    assert str(info.value) == "token ids must be integers in [0, 2**32)"


def test_a_list_and_an_array_of_the_same_ids_hash_alike() -> None:
    ids = [0, 1, 2**32 - 1, 7]
    hasher = BlockHasher(2)
    assert hasher.hash_tokens(ids) == hasher.hash_tokens(np.array(ids, dtype=np.int64))


def test_adapter_names_with_lone_surrogates_hash_and_stay_apart() -> None:
    base = BlockHasher(4)
    odd = base.for_adapter("\ud800")  # JSON may carry one in a model name
    assert odd.hash_tokens([1, 2, 3, 4]) != base.hash_tokens([1, 2, 3, 4])
    assert odd.hash_tokens([1, 2, 3, 4]) != base.for_adapter("\ud801").hash_tokens([1, 2, 3, 4])


@pytest.mark.parametrize("container", [bytes, bytearray])
def test_bytes_are_token_ids_one_per_byte(container: type[bytes | bytearray]) -> None:
    """A bytes object is a sequence of ints like any other, not raw uint32 memory."""
    ids = [1, 2, 3, 250, 7, 0, 9, 8]
    assert BlockHasher(2).hash_tokens(container(ids)) == BlockHasher(2).hash_tokens(ids)
