"""``prefixroute hash-key``: the SHA-256 digest a config file stores for a client API key.

    prefixroute hash-key --generate     # a new random key, then its digest (show the key once)
    prefixroute hash-key < key.txt      # the digest of a key read from stdin (first line)

The same digest as ``printf %s "$KEY" | sha256sum``. Reading the key from stdin keeps it out of
the shell history and the process list.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prefixroute.core import ConfigError
from prefixroute.gateway import MAX_SECRET_CHARS, generate_api_key, hash_api_key

MIN_KEY_CHARS = 20  # shorter keys could be searched for from their unsalted digest


def add_parser(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "hash-key",
        help="print the SHA-256 digest of a client API key, for [[tenancy.tenants]] api_key_sha256",
        description="Reads an API key from stdin (or makes one with --generate) and prints the "
        "digest the gateway's config stores for it.",
    )
    p.add_argument(
        "--generate", action="store_true", help="make a new random key and print it first"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.generate:
        key = generate_api_key()
        print(f"key:    {key}")
        print(f"sha256: {hash_api_key(key)}")
        return 0
    key = _read_key()
    if key != key.strip():  # a header's value loses them (and the gateway strips the rest)
        raise ConfigError(
            "the API key has spaces or tabs at an end, which no request can send: remove them"
        )
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(
            f"an API key needs at least {MIN_KEY_CHARS} random characters "
            "(`prefixroute hash-key --generate` makes one)"
        )
    print(hash_api_key(key))
    return 0


def _read_key() -> str:
    """The first line of stdin. Python sets ``sys.stdin`` to None when the shell closed it
    (``<&-``), and a read can fail (stdin a directory) or meet bytes that are not text: each
    is one line of error rather than a traceback."""
    if sys.stdin is None:
        raise ConfigError(
            "stdin is closed: pipe the API key in (`prefixroute hash-key < key.txt`) or use "
            "--generate"
        )
    if sys.stdin.isatty():  # else a blank cursor waits, and the key is echoed as typed
        print("API key (Enter to end; it is shown as typed):", file=sys.stderr, flush=True)
    try:
        line = sys.stdin.readline(MAX_SECRET_CHARS + 2)  # bounded: stdin may be /dev/zero
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the API key from stdin: {exc}") from None
    key = line.rstrip("\r\n")
    if len(key) > MAX_SECRET_CHARS:
        raise ConfigError(f"the API key's first line is over {MAX_SECRET_CHARS} characters")
    return key
