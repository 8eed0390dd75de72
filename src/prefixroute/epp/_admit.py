"""Before a pick: the request's tenant and routing key, as ``prefixroute serve`` admits them.

**Tenant.** The picker holds the gateway's own ``Tenants``, built from the same ``[tenancy]``
table of the same ``--config`` file, and reads the client's headers, which Envoy forwards: with
API keys configured, ``Authorization: Bearer <key>`` or ``x-api-key: <key>`` names the tenant
(a missing or unknown key: 401); without, the tenant header (``x-tenant-id`` by default; a
malformed name: 400). The tenant's limiter then admits the request (``max_in_flight``,
``requests_per_second``: 429 with Retry-After, the body naming the limit). Every refusal happens
on the request headers, before the body, and is the gateway's status and JSON body
(``gateway.error_response``) sent as an ``ImmediateResponse``. The tenant's in-flight slot is
held until the ext_proc stream ends (the answer's end, streaming included), as the gateway's
middleware holds it until its handler returns. The client's key was the picker's to check, not
the replica's: the replica gets the gateway's upstream key in its place (``upstream_api_key``),
or no credential header at all, as ``gateway.upstream_headers`` decides for the gateway's own
upstream requests.

**Key.** The body is parsed under the gateway's rules, then ``GatewayState.route_key`` puts the
key in the tenant's key space (under ``[tenancy] isolation``: its own hash seed, and the body's
``cache_salt`` set, or removed for a shareable prefix), names its LoRA adapter and, with a
tokenizer, turns its text into the engines' token ids. Under isolation the body the replica gets
is the re-encoded object (``gateway.encode_body``), with its new ``content-length``, as the
gateway sends it. The prompt-token budget (``prompt_tokens_per_minute``) is charged on the hashed
prompt, as the gateway's proxy charges it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from multidict import CIMultiDict, CIMultiDictProxy

from prefixroute.core import EMPTY_KEY, Endpoint, PrefixrouteError, RouteKey
from prefixroute.gateway import (
    API_KEY_HEADER,
    GatewayState,
    Tenants,
    TenantScope,
    check_json_type,
    encode_body,
    isolated,
    key_of,
    parse_body,
    upstream_headers,
)

AUTHORIZATION = "authorization"
CREDENTIALS = (AUTHORIZATION, API_KEY_HEADER)  # where a client's key may come


@dataclass(slots=True)
class Admission:
    """One request's tenant, from its headers to the stream's end."""

    scope: TenantScope
    set_headers: dict[str, str] = field(default_factory=dict)  # for the replica
    remove_headers: list[str] = field(default_factory=list)
    released: bool = False

    def release(self) -> None:
        """The stream ended: the tenant's in-flight slot is free (once)."""
        if not self.released:
            self.released = True
            self.scope.tenant.limiter.release()


def admit(tenants: Tenants, headers: Mapping[str, str], now: float) -> Admission:
    """Identify the tenant of ``headers`` and count the request in under its limits; raises
    Unauthorized, BadRequest or RateLimited (each counted in the tenant rejections metric)."""
    given = CIMultiDict(headers)  # the tenants read names case-insensitively, as from aiohttp
    tenant = tenants.get(tenants.identify(given), now)
    try:
        tenant.limiter.admit(now)
    except PrefixrouteError as exc:  # RateLimited
        tenants.rejections.labels(getattr(exc, "limit", "other")).inc()
        raise
    admission = Admission(TenantScope(tenant, tenants))
    admission.set_headers, admission.remove_headers = _credentials(given, admission.scope)
    return admission


def _credentials(headers: CIMultiDict[str], scope: TenantScope) -> tuple[dict[str, str], list[str]]:
    """The credential headers' changes the replica's request needs (``Authorization`` and
    Anthropic's ``x-api-key``): what the gateway's ``upstream_headers`` would send in place of
    the client's."""
    client = CIMultiDict[str]()
    for name in CREDENTIALS:
        if name in headers:
            client[name] = headers[name]
    upstream = upstream_headers(CIMultiDictProxy(client), "", scope)
    sets: dict[str, str] = {}
    removed: list[str] = []
    for name in CREDENTIALS:
        value = upstream.get(name)
        if value is None and name in client:
            removed.append(name)
        elif value is not None and value != client.get(name):
            sets[name] = value
    return sets, removed


async def request_key(
    state: GatewayState,
    endpoint: Endpoint,
    body: bytes,
    scope: TenantScope | None,
    content_type: str = "",
    ask_usage: bool = False,
) -> tuple[RouteKey, bytes | None, bool]:
    """The router's key of ``body`` sent to ``endpoint`` (declared as ``content_type``), the
    body to send in its place (None: the body as the client sent it), and whether that body asks
    for a stream's usage the client did not (``ask_usage``: the gateway's ``stream_usage``,
    where the answer can be edited); raises the gateway's 400s and 415 (``check_json_type``)."""
    if not body and endpoint is Endpoint.OTHER:  # routed on load alone, in the tenant's name
        return await state.route_key(Endpoint.OTHER, EMPTY_KEY, None, scope), None, False
    if endpoint is not Endpoint.OTHER:
        check_json_type(content_type)  # as serve checks it
    obj = parse_body(body)  # an empty one where a prompt belongs: serve's 400, invalid JSON
    key = await state.route_key(endpoint, key_of(endpoint, obj), obj, scope)  # edits obj
    if endpoint is Endpoint.OTHER:
        return key, None, False
    asked = ask_usage and state.ask_stream_usage(endpoint, obj)
    full = state.ask_full_kv_report(endpoint, obj)  # precise mode, a stream lost (gateway's)
    if isolated(scope) or asked or full:
        return key, encode_body(obj), asked  # cache_salt or stream_options: the replica reads it
    return key, None, False
