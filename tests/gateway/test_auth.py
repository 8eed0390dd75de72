"""API-key digests, the key table and secret comparison."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from prefixroute.gateway._auth import (
    KeyTable,
    bearer_token,
    generate_api_key,
    hash_api_key,
    secrets_equal,
)
from prefixroute.gateway._tenant_config import TenantSpec


def test_digest_is_plain_sha256_hex() -> None:
    assert hash_api_key("pr-secret") == hashlib.sha256(b"pr-secret").hexdigest()


def test_generated_keys_are_long_and_distinct() -> None:
    keys = {generate_api_key() for _ in range(50)}
    assert len(keys) == 50 and all(k.startswith("pr-") and len(k) >= 40 for k in keys)


def test_key_table_finds_the_owner_only_for_its_keys() -> None:
    a, b = generate_api_key(), generate_api_key()
    table = KeyTable(
        [
            TenantSpec("team-a", (hash_api_key(a),)),
            TenantSpec("team-b", (hash_api_key(b), hash_api_key(b + "2"))),
            TenantSpec("no-keys"),
        ]
    )
    assert len(table) == 3
    assert table.tenant_of(a) == "team-a"
    assert table.tenant_of(b + "2") == "team-b"
    assert table.tenant_of(hash_api_key(a)) is None  # the digest is not the key
    assert table.tenant_of("") is None and table.tenant_of(None) is None
    assert table.tenant_of("\udcff\ud800") is None  # undecodable header bytes do not fail


def test_bearer_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc  ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None and bearer_token("") is None


def test_secrets_equal_whatever_the_lengths() -> None:
    assert secrets_equal("change-me-please", "change-me-please")
    assert not secrets_equal("change-me", "change-me-please")
    assert not secrets_equal("", "x")
    assert not secrets_equal("\udcff", "x")


def test_hash_key_command_reads_stdin(tmp_path: object) -> None:
    key = "pr-" + "x" * 40
    out = subprocess.run(
        [sys.executable, "-m", "prefixroute.cli", "hash-key"],
        input=key + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == hash_api_key(key)
    short = subprocess.run(
        [sys.executable, "-m", "prefixroute.cli", "hash-key"],
        input="short\n",
        capture_output=True,
        text=True,
    )
    assert short.returncode == 2 and "at least" in short.stderr
    # A key with blanks at an end: no request can send it (a header's value loses them, and
    # the gateway strips the rest), so its digest would never match.
    for padded in (key + " ", " " + key, key + "\t"):
        out = subprocess.run(
            [sys.executable, "-m", "prefixroute.cli", "hash-key"],
            input=padded + "\n", capture_output=True, text=True,
        )  # fmt: skip
        assert out.returncode == 2 and "spaces or tabs at an end" in out.stderr, repr(padded)


def test_hash_key_with_stdin_closed_is_one_line() -> None:
    """``hash-key <&-``: Python's sys.stdin is None then; one line of error, not an
    AttributeError traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "prefixroute.cli", "hash-key"],
        stdin=None,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.close(0),  # the child starts with fd 0 closed, as after <&-
    )
    assert out.returncode == 2, out.stderr
    assert (
        out.stderr.startswith("prefixroute: error: stdin is closed") and out.stderr.count("\n") == 1
    ), out.stderr


def test_hash_key_reads_a_bounded_first_line() -> None:
    """``hash-key < /dev/zero`` read without end (a MemoryError traceback under a memory
    limit: an outside review, 2026-12-07); a line longer than any key is one line of error."""
    with open("/dev/zero", "rb") as zeros:
        out = subprocess.run(
            [sys.executable, "-m", "prefixroute.cli", "hash-key"],
            stdin=zeros, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2 and "over 4096 characters" in out.stderr
    assert out.stderr.count("\n") == 1
