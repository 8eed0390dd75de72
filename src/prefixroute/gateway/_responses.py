"""The Responses API's stored responses: which replica holds each, and who may reach it.

vLLM (with ``VLLM_ENABLE_RESPONSES_API_STORE=1``) and OpenAI keep each response a replica
answered (``store``, true by default), under its id, in that replica's memory. Three calls name
one: ``POST /v1/responses`` with ``previous_response_id`` (the conversation so far is the stored
one, which the request does not repeat), ``GET /v1/responses/{id}`` and
``POST /v1/responses/{id}/cancel``. Any other replica answers them 404, so routing by prefix or
load would fail them; the router's prefix match cannot help either, since the request carries
only its new input. So the gateway notes the replica of every Responses answer (the id of a
whole answer, or of a stream's ``response.created``) in :class:`ResponseOwners`, and those
calls go to that replica only (:func:`pinned`): where it is down or draining, the call fails
as no replica available (503), since no other replica holds what it names; where it is up but
at its in-flight cap, as overloaded (503 with ``Retry-After``; the picker's 429), since a
retry later will find it.

Ids are kept per tenant: a tenant reaches only the responses answered to it. With tenant
isolation on, a continuation whose id the gateway does not know is refused (404) rather than
routed, and a client may not choose the id of its response (vLLM's ``request_id`` field):
otherwise a tenant that learned or guessed another's id could read that conversation, or
overwrite it. Without isolation a continuation of an unknown id is routed as any request (it
may have been answered through an instance this one does not hear from); ``GET`` and ``cancel``
of an unknown id are 404 here, since nothing says which replica to ask. With ``--sync-redis``
the instances share the map: each answer's replica is published (``publish``) and the others'
recorded, the latest few thousand replayed to an instance that starts later. The map keeps the
latest ``OWNERS_KEPT`` ids (a few tens of MB at most); an older one is forgotten as an unknown
one. Past that, a tenant that holds more than its share (``OWNERS_KEPT`` over the tenants
holding ids) makes room by forgetting its own oldest, not the oldest of all: one tenant's flood
of answers would otherwise push every other tenant's ids out, and under isolation their
continuations would be refused as unknown.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from prefixroute.core import Endpoint, NoReplicaAvailable, ReplicaId, RouteKey
from prefixroute.gateway._errors import BadRequest, NotFound
from prefixroute.gateway._paths import RESPONSE_ID
from prefixroute.gateway._requests import Admitted

OWNERS_KEPT = 100_000  # stored responses whose replica is remembered (the latest)


class ResponseOwners:
    """Which replica answered each stored response, by tenant (module docstring)."""

    def __init__(self, capacity: int = OWNERS_KEPT) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[tuple[str | None, str], ReplicaId] = OrderedDict()
        # Each tenant's ids, oldest first (beside ``_owners``' order of all): whose to forget.
        self._of: dict[str | None, OrderedDict[str, None]] = {}
        # Tells the other instances of each answer here (``RouteSync.stored``), if any.
        self.publish: Callable[[str | None, str, ReplicaId], None] | None = None

    def __len__(self) -> int:
        return len(self._owners)

    def answered(self, tenant: str | None, response_id: str, replica: ReplicaId) -> None:
        """``replica`` answered ``tenant``'s response ``response_id`` here: recorded, and
        published to the other instances."""
        self.record(tenant, response_id, replica)
        if self.publish is not None:
            self.publish(tenant, response_id, replica)

    def record(self, tenant: str | None, response_id: str, replica: ReplicaId) -> None:
        """``replica`` answered (and may store) ``tenant``'s response ``response_id``."""
        key = (tenant, response_id)
        self._owners[key] = replica
        self._owners.move_to_end(key)
        mine = self._of.setdefault(tenant, OrderedDict())
        mine[response_id] = None
        mine.move_to_end(response_id)
        while len(self._owners) > self.capacity:
            share = max(1, self.capacity // len(self._of))
            # Over its share, a tenant forgets its own oldest; else the oldest of all goes.
            gone = (tenant, next(iter(mine))) if len(mine) > share else next(iter(self._owners))
            del self._owners[gone]
            of = self._of[gone[0]]
            del of[gone[1]]
            if not of:
                del self._of[gone[0]]

    def owner(self, tenant: str | None, response_id: str) -> ReplicaId | None:
        """The replica that answered ``tenant``'s ``response_id`` (None: not known here)."""
        return self._owners.get((tenant, response_id))

    def recorder(self, admitted: Admitted, replica: ReplicaId) -> Callable[[str], None] | None:
        """What notes the id of ``admitted``'s stream as ``replica``'s, as soon as the stream
        names it (None: not a Responses call)."""
        if admitted.endpoint is not Endpoint.RESPONSES:
            return None
        tenant = admitted.key.tenant
        return lambda response_id: self.answered(tenant, response_id, replica)

    def of_request(self, key: RouteKey, body: object, isolated: bool) -> ReplicaId | None:
        """The replica a ``POST /v1/responses`` (keyed ``key``, parsed ``body``) must go to:
        the owner of the response it continues, or None (route it as any other). Raises
        BadRequest for a chosen id and NotFound for an unknown continuation, under tenant
        isolation (module docstring)."""
        if isolated and isinstance(body, Mapping) and body.get("request_id") is not None:
            raise BadRequest("'request_id' may not be set under tenant isolation")
        if key.continues is None:
            return None
        owner = self.owner(key.tenant, key.continues)
        if owner is None and isolated:
            raise NotFound(_not_found(key.continues))
        return owner

    def of_stored(self, tenant: str | None, response_id: str) -> ReplicaId:
        """The replica to ask for stored response ``response_id`` (GET, cancel); raises
        NotFound when its id is malformed or not known here."""
        owner = self.owner(tenant, response_id) if RESPONSE_ID.match(response_id) else None
        if owner is None:
            raise NotFound(_not_found(response_id))
        return owner


def _not_found(response_id: str) -> str:
    """vLLM's message, naming the id only when it is one (at most 256 word characters): no
    error repeats the client's bytes otherwise (docs/security.md; a 1 MB id came back whole)."""
    named = f" with id '{response_id}'" if RESPONSE_ID.match(response_id) else ""
    return f"Response{named} not found."


def pinned(owner: ReplicaId | None, candidates: list[ReplicaId]) -> list[ReplicaId]:
    """``candidates``, or only ``owner`` when a request must go there; raises
    NoReplicaAvailable when it is not among them (down, draining, or already failed). Callers
    pass the ready replicas, before the in-flight cap, so an owner that is up but full is
    refused by the cap as Overloaded (retry later) instead."""
    if owner is None:
        return candidates
    if owner not in candidates:
        raise NoReplicaAvailable("the replica that stored this response is not available")
    return [owner]
