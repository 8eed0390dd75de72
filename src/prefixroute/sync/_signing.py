"""The sync messages' signatures: HMAC-SHA256 under a secret every instance shares.

Redis PUB/SUB authenticates connections, not messages: anyone who can publish to the channel
(a password shared with another application, a Redis left open on the network) was believed.
One forged ``Stored`` message let a tenant read and continue another tenant's stored Responses
(the owner map's tenant check trusts the sync), one forged decision with a huge prompt kept a
replica out of every instance's routing for up to ten minutes, and a few thousand small ones
turned every request of every instance into a 503 (an outside audit, 2026-12-06).

With ``sync_secret`` each message travels as ``tag + payload``, the tag the first 16 bytes of
``HMAC-SHA256(key, payload)`` (128 bits: RFC 2104's truncation), the key derived from the
secret. A message whose tag does not match is dropped and counted
(``prefixroute_sync_errors_total{kind="auth"}``), so instances with different secrets (or one
without) simply do not share. Messages stay readable in Redis (tenant names and response ids
travel in clear), and a recorded message can be sent again; what a signature stops is a
message no instance wrote. Of the recorded ones, only a decision could do harm sent again (its
request counted as load once more, for up to ten minutes): signed, a decision counts only
while fresh and once (``_remote.RemoteRequests``). Without a secret every message is believed,
as before: the Redis must then be reachable by the gateways alone (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_ENV = "PREFIXROUTE_SYNC_SECRET"  # where every command (and the Ray router) reads it
TAG_BYTES = 16
_CONTEXT = b"prefixroute sync v1\0"  # the key is for this use only


class Signer:
    """Signs and opens sync messages under one shared secret."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(_CONTEXT + secret.encode("utf-8")).digest()

    def _tag(self, payload: bytes) -> bytes:
        return hmac.digest(self._key, payload, "sha256")[:TAG_BYTES]

    def sign(self, payload: bytes) -> bytes:
        """``payload`` as it travels: its tag, then itself."""
        return self._tag(payload) + payload

    def open(self, message: bytes) -> bytes | None:
        """The payload of a signed ``message``; None when its tag does not match (forged,
        damaged, or signed under another secret)."""
        tag, payload = message[:TAG_BYTES], message[TAG_BYTES:]
        if len(tag) < TAG_BYTES or not hmac.compare_digest(tag, self._tag(payload)):
            return None
        return payload
