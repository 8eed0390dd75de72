"""Client API keys and secret comparison.

Keys are stored only as SHA-256 hex digests (``prefixroute hash-key``, or
``printf %s "$KEY" | sha256sum``). A plain, unsalted SHA-256 is enough because the keys are
random (``prefixroute hash-key --generate`` makes 256-bit ones): nobody can search that space,
so a slow password hash would only slow every request down.

Every comparison of a secret runs in constant time. A presented key is hashed, and its digest
is compared with every stored digest by ``hmac.compare_digest``, without stopping at a match,
so the time taken depends on the number of keys only. The admin token is compared the same
way, by digest, which also hides its length.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping

from prefixroute.gateway._tenant_config import TenantSpec

KEY_PREFIX = "pr-"  # generated keys start with it, so they are easy to spot in a leak scan


def hash_api_key(key: str) -> str:
    """The SHA-256 hex digest a config file stores for ``key``."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def generate_api_key() -> str:
    """A new random API key (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _digest(secret: str) -> bytes:
    # surrogatepass: header values are decoded with surrogateescape; they must hash, not fail.
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def secrets_equal(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets, whatever their lengths."""
    return hmac.compare_digest(_digest(given), _digest(expected))


API_KEY_HEADER = "x-api-key"  # Anthropic's credential header (its SDKs send it by default)


def client_key(headers: Mapping[str, str]) -> str | None:
    """A client's API key: ``Authorization: Bearer <key>`` (OpenAI's), else ``x-api-key:
    <key>`` (Anthropic's, as its SDKs and Claude Code with ``ANTHROPIC_API_KEY`` send it);
    None when neither carries one."""
    bearer = bearer_token(headers.get("Authorization", ""))
    if bearer is not None:
        return bearer
    key = headers.get(API_KEY_HEADER, "").strip()
    return key or None


def bearer_token(authorization: str) -> str | None:
    """The credential of an ``Authorization: Bearer <token>`` header, else None."""
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


class KeyTable:
    """Stored key digests -> tenant names."""

    def __init__(self, tenants: Iterable[TenantSpec]) -> None:
        self._entries = [
            (bytes.fromhex(digest), spec.name) for spec in tenants for digest in spec.api_key_sha256
        ]

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, key: str | None) -> str | None:
        """The tenant whose key this is, or None (no key, or an unknown one)."""
        digest = _digest(key) if key else bytes(32)
        found: str | None = None
        for stored, tenant in self._entries:  # no early exit: time does not depend on position
            if hmac.compare_digest(stored, digest):
                found = tenant
        return found if key else None
