"""The Responses API's stored responses through the picker: the gateway's rule
(``gateway/_responses.py``) on ext_proc messages, with the one map of owners the picker's
gateway state holds.

A ``POST /v1/responses`` that continues a stored response (``previous_response_id``), and
``GET /v1/responses/{id}`` or its ``cancel``, are picked among the one replica that answered it:
the proxy is told that endpoint only (no fallbacks), and a refusal (an unknown id under
isolation, an unknown id's ``GET``, a chosen ``request_id`` under isolation) is the gateway's
error as an immediate response. Each Responses answer's id is noted as its replica's as soon as
the answer names it: a stream's ``response.created``, a plain answer's body at its end.
"""

from __future__ import annotations

import re

from prefixroute.core import Endpoint, ReplicaId, RouteKey
from prefixroute.epp._answer import AnswerReader
from prefixroute.gateway import (
    PROMPT_ENDPOINTS,
    GatewayState,
    TenantScope,
    isolated,
    parse_body,
)

__all__ = ["StoredNote", "stored_owner"]

STORED_PATH = re.compile(r"\A/v1/responses/([^/]+)(?:/cancel)?\Z")  # a stored response's calls


def stored_owner(
    state: GatewayState, path: str, key: RouteKey, body: bytes, scope: TenantScope | None
) -> tuple[ReplicaId | None, StoredNote | None]:
    """The one replica a request to ``path`` (keyed ``key``) may go to (None: any), and what
    notes its answer's id where it is a Responses call; raises the gateway's NotFound or
    BadRequest (``ResponseOwners``)."""
    if PROMPT_ENDPOINTS.get(path) is Endpoint.RESPONSES:
        refusing = isolated(scope)
        obj = parse_body(body) if refusing and b'"request_id"' in body else None
        return state.responses.of_request(key, obj, refusing), StoredNote(state, key.tenant)
    stored = STORED_PATH.match(path)
    if stored is None:
        return None, None
    return state.responses.of_stored(key.tenant, stored.group(1)), None


class StoredNote:
    """Notes a Responses answer's id as its replica's, once (module docstring)."""

    def __init__(self, state: GatewayState, tenant: str | None) -> None:
        self.state, self.tenant = state, tenant
        self.noted = False

    def read(self, reader: AnswerReader, replica: ReplicaId, ended: bool) -> None:
        """What ``reader`` has read of ``replica``'s answer so far (``ended``: all of it)."""
        if self.noted:
            return
        response_id = reader.response_id(ended)
        if response_id is not None:
            self.state.responses.answered(self.tenant, response_id, replica)
            self.noted = True
