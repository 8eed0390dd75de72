"""The Redis history as an instance that (re)subscribes replays it (``_redis``): a decision a
withdrawal followed is left out, since its replica computed none of it (``_remote``'s
module docstring)."""

from __future__ import annotations

import msgspec

from prefixroute.sync._wire import Routed, Withdrawn, decode


def without_withdrawn(history: list[bytes]) -> list[bytes]:
    """The history's messages to replay, oldest first: ``history`` comes newest first (as the
    Redis list holds it), and each withdrawal removes itself and the latest decision of its
    request before it. A request routed again after a withdrawal (a retry at another replica)
    keeps that later decision. Undecodable messages pass, for ``apply`` to count."""
    pending: set[tuple[str, str]] = set()  # withdrawals whose decision is still to come
    kept: list[bytes] = []
    for payload in history:  # newest first: a withdrawal is met before its decision
        try:
            msg = decode(payload)
        except msgspec.DecodeError:
            kept.append(payload)
            continue
        if isinstance(msg, Withdrawn):
            if msg.request_id:  # a decision without an id was never counted: none to find
                pending.add((msg.instance, msg.request_id))
            continue
        if isinstance(msg, Routed) and (key := (msg.instance, msg.request_id)) in pending:
            pending.discard(key)
            continue
        kept.append(payload)
    kept.reverse()
    return kept
