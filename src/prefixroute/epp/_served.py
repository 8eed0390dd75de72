"""A fallback served the answer: the primary failed the request, which moves to the fallback.

With ``fallbacks`` (N > 0) the proxy may try up to N more endpoints after the primary; the
response's metadata (or Envoy's ``upstream.address``) says which one answered. Part of
:class:`prefixroute.epp._stream.PickStream`'s answer side, kept in its own module: the
primary's failure counts as the gateway counts a failed attempt, and the request's accounting
moves to the replica that served it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from prefixroute.core import ConfigError, Decision, ReplicaId
from prefixroute.epp._candidates import endpoint_of, replica_of

if TYPE_CHECKING:
    from prefixroute.epp._stream import PickStream

log = logging.getLogger(__name__)


def note_served(stream: PickStream, served: str | None, decision: Decision) -> None:
    """The proxy went past the primary, which failed this request (its failure counts, as
    the gateway's failed attempts): what follows is the served replica's answer."""
    if served is None or served == endpoint_of(decision.replica):
        return
    try:
        rid = replica_of(served)
    except ConfigError:
        return
    log.info("%s: picked %s, served by %s", stream.rid, decision.replica, served)
    s = stream.s
    if served in stream.destinations[1:] and s.router.has_replica(rid):
        stream.served = rid
        if s.router.has_replica(decision.replica):
            s.registry.record_failure(decision.replica, s.clock(), f"fell back to {served}")
            stream._marked = True
        _move_to(stream, rid)


def _move_to(stream: PickStream, replica: ReplicaId) -> None:
    """A fallback served the request: the primary's accounting ends, learning nothing; the
    request is routed again to the fallback, as the gateway retries (its times untaught).
    No first token there: one would pass plain answers sent before it (plain_answers.py)."""
    s, now, view = stream.s, stream.s.clock(), stream._view
    s.router.complete(stream.rid, now)
    if s.sync is not None:
        s.sync.completed(stream.rid)
    if view is None:
        stream._done = True
        return
    stream.rid = f"{stream.rid}-fallback"
    stream._view = view = dataclasses.replace(view, request_id=stream.rid)
    stream.decision = s.router.route(view, now, [replica])
    stream._untimed = True
    if s.sync is not None:
        s.sync.routed(view, stream.decision)
