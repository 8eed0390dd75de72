"""The Redis sync's messages as they travel: msgpack arrays, one tag each (``_sync``).

A decision is (instance, replica, block hashes) and, when it is to count as load, the request's
id and sizes; a request's first token and end follow as small progress messages, and so does
the word that the replica turned it away; so does the replica of each stored Responses API
answer. Hashes travel
as one bytes field, little-endian uint64 (8 bytes a block), so a 500-block prompt costs 4 KB
and no per-hash framing. Instances must agree on this format and on replica ids (normalized
base URLs); an instance ignores what it cannot decode and counts it (``_metrics``).
"""

from __future__ import annotations

import array
import sys
import time
from collections.abc import Sequence
from typing import Annotated

import msgspec

from prefixroute.core import BlockHash, Decision, ReplicaId, RequestView

# Bounds on what a message may say, each far above any real request's: a message past one is
# a decode error, not load. Before (an outside audit, 2026-12-06), one decision of 2**64 prompt
# tokens kept a replica out of every instance's routing, one of a million hashes stalled every
# instance's event loop for 1.5 s, and 1 MB response ids grew memory without bound.
Size = Annotated[int, msgspec.Meta(ge=0, le=2**24)]  # tokens: 16M, past any context window
Name = Annotated[str, msgspec.Meta(max_length=256)]  # an instance, request, tenant or response id
Url = Annotated[str, msgspec.Meta(max_length=2048)]  # a replica id: its base URL
MAX_BLOCKS = 2**17  # block hashes in one decision: 8M tokens at 64 per block
Hashes = Annotated[bytes, msgspec.Meta(max_length=8 * MAX_BLOCKS)]


class Routed(msgspec.Struct, array_like=True, frozen=True, tag=0):
    """One routing decision as it travels, a msgpack array led by its tag (0)."""

    instance: Name  # the publishing instance's id (its own messages are ignored)
    replica: Url  # replica id (normalized base URL): instances must name replicas alike
    hashes: Hashes  # the request's block hashes, little-endian uint64, root first
    request_id: Name = ""  # the publisher's id for the request ("": not counted as load)
    prompt_tokens: Size = 0  # the request's sizes, for the others' load views, tokens
    output_tokens: Size = 0
    predicted_cached_tokens: Size = 0
    # When it was sent, seconds since the epoch (0.0: an instance that predates the field). A
    # signed decision is counted as load only while fresh (``_remote``): a recorded one, sent
    # again, is not.
    sent_at: float = 0.0

    def block_hashes(self) -> list[BlockHash]:
        """The hashes as ints; ValueError unless a whole number of 8-byte hashes."""
        packed = array.array("Q")
        packed.frombytes(self.hashes)
        if sys.byteorder != "little":
            packed.byteswap()
        return [BlockHash(h) for h in packed]


Count = Annotated[int, msgspec.Meta(ge=-1, le=2**24)]  # requests (-1: not told)
Number = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class Progress(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A routed request's first token (``done`` false) or end (``done`` true); with no
    ``request_id``, the instance's heartbeat (``_remote``), which also carries its number
    (from 1), when it was sent and how many of its counted requests have not ended yet (their
    decisions sent, their ends not). An instance that predates them sends a heartbeat without
    them, and reads one that has them as before (msgpack arrays: the fields it does not know
    come last, and are ignored)."""

    instance: Name
    request_id: Name
    done: bool
    seq: Number = 0  # a heartbeat's number, from 1 (0: not told)
    sent_at: float = 0.0  # a heartbeat's time, seconds since the epoch
    open: Count = -1  # a heartbeat's count of the instance's requests not ended
    keys: Name = ""  # a heartbeat's prompt hashing (``_remote.hashing_keys``; "": not told)


class _Step(msgspec.Struct, array_like=True, frozen=True, tag=1):
    """A first token or an end as sent: a :class:`Progress` without a heartbeat's fields (the
    encoder writes every field, defaults too, and these go out twice a request)."""

    instance: Name
    request_id: Name
    done: bool


class Withdrawn(msgspec.Struct, array_like=True, frozen=True, tag=2):
    """The replica turned a routed request away (``Router.withdraw``): its end follows. A tag
    of its own: an instance that predates it skips it as undecodable, instead of reading it as
    a first token."""

    instance: Name
    request_id: Name


class Stored(msgspec.Struct, array_like=True, frozen=True, tag=3):
    """A replica answered (and may store) a Responses API response: its continuations and
    fetches go there at every instance (``gateway/_responses.py``). An older instance skips
    the tag as undecodable."""

    instance: Name
    tenant: Name | None  # whose it is (None: no tenancy)
    response_id: Name
    replica: Url


Message = Routed | Progress | Withdrawn | Stored

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(
    instance: str,
    replica: ReplicaId,
    hashes: Sequence[BlockHash],
    view: RequestView | None = None,
    decision: Decision | None = None,
) -> bytes:
    """A decision; with ``view`` and ``decision``, also the request's id and sizes."""
    packed = array.array("Q", hashes)
    if sys.byteorder != "little":
        packed.byteswap()
    if view is None or decision is None:
        return _encoder.encode(Routed(instance, replica, packed.tobytes()))
    return _encoder.encode(
        Routed(
            instance,
            replica,
            packed.tobytes(),
            view.request_id,
            view.prompt_tokens,
            view.output_tokens,
            decision.predicted_cached_tokens,
            time.time(),
        )
    )


def encode_progress(instance: str, request_id: str, done: bool) -> bytes:
    return _encoder.encode(_Step(instance, request_id, done))


def encode_alive(instance: str, seq: int, open_requests: int, keys: str = "") -> bytes:
    """A heartbeat: the ``seq``-th, sent now, with ``open_requests`` counted and not ended,
    from an instance that hashes prompts as ``keys`` says."""
    return _encoder.encode(Progress(instance, "", False, seq, time.time(), open_requests, keys))


def encode_withdrawn(instance: str, request_id: str) -> bytes:
    return _encoder.encode(Withdrawn(instance, request_id))


def encode_stored(instance: str, tenant: str | None, response_id: str, replica: ReplicaId) -> bytes:
    return _encoder.encode(Stored(instance, tenant, response_id, replica))


def decode(payload: bytes) -> Message:
    """A message; raises ``msgspec.DecodeError`` (ValueError comes from ``block_hashes``)."""
    return _decoder.decode(payload)
