"""Tenants at runtime: who sent a request, what it may still do, and its own prefix-key space.

**Who.** The tenant middleware runs for every path but ``/health``, ``/metrics`` and
``/admin/*``, so anything not listed there is denied by default:

* API keys configured (any ``api_key_sha256``): the request must carry
  ``Authorization: Bearer <key>`` with one of them, or ``x-api-key: <key>`` (Anthropic's header,
  which its SDKs send), else 401; the key's owner is the tenant. The tenant header is ignored,
  so a key holder cannot claim another tenant. Neither header reaches a replica.
* No keys: the tenant header (``x-tenant-id`` by default) names the tenant, as sent. That mode
  is for a gateway behind an authenticating proxy that sets the header; without the header the
  request belongs to the default tenant.

**Limits.** The tenant's limiter admits the request (in-flight cap, request rate) and holds
its slot until the handler returns; the proxy charges the prompt-token budget once the prompt
is hashed (the estimate is the router's own). A 429 names the limit.

**Isolation** (``[tenancy] isolation = true``). Each tenant has a salt: the configured
``cache_salt``, or ``base64url(HMAC-SHA256(secret, name))`` (43 characters, 256 bits, as vLLM
asks). Its router seed is the salt hashed into the common seed (:meth:`BlockHasher.salted`, the
same step the emulated engine takes), so the router's block hashes of one tenant never equal
another's, and the salt goes to the replica as ``cache_salt`` (vLLM
mixes it into the first block's hash, so the engine keeps the tenants' blocks apart too), or as
``extra_key`` on SGLang's ``/generate`` (the field its OpenAI server fills from ``cache_salt``;
an SGLang older than that field ignores it, and keeps no tenants apart). The gateway owns that
field: a client's own is replaced. A request whose routing text
starts with one of ``shareable_prefixes`` is shared instead: hashed with the common seed and
sent with no salt (vLLM salts a whole prompt or nothing: see docs/security.md for what that
shares).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import Counter
from prometheus_client.registry import CollectorRegistry

from prefixroute.core import BlockHasher, Endpoint, RouteKey
from prefixroute.gateway._admission import REQUEST_ID_HEADER
from prefixroute.gateway._auth import API_KEY_HEADER, KeyTable, client_key
from prefixroute.gateway._errors import BadRequest, RateLimited, Unauthorized
from prefixroute.gateway._ratelimit import TenantLimiter
from prefixroute.gateway._relay import request_headers
from prefixroute.gateway._tenant_config import TENANT_NAME, TenancyConfig, TenantLimits
from prefixroute.gateway._usage import Usage

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})  # no key
# Paths that check the admin token themselves, not a client key (/dashboard: _dashboard).
OWN_AUTH_PREFIXES = ("/admin/", "/dashboard")
_SALT_CONTEXT = b"prefixroute cache_salt v1\x00"


@dataclass(slots=True, eq=False)
class Tenant:
    name: str
    salt: str  # the cache_salt its requests carry upstream (with isolation)
    seed: int  # the router's hash seed for its prompts: its own key space
    limiter: TenantLimiter


class Tenants:
    """The tenants known to one gateway: identification, limits, salts."""

    def __init__(
        self,
        config: TenancyConfig,
        upstream_api_key: str | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.upstream_api_key = upstream_api_key  # sent to replicas instead of the client's key
        self.keys = KeyTable(config.tenants)
        secret = config.cache_salt_secret
        if secret is None and config.isolation:
            log.warning(
                "tenant isolation without tenancy.cache_salt_secret: salts are random for this "
                "process, so replicas' cached prefixes are not reused across gateway restarts"
            )
        self._secret = secret.encode() if secret is not None else secrets.token_bytes(32)
        self._overrides: dict[str, TenantLimits] = {}  # set through the admin API
        self._live: OrderedDict[str, Tenant] = OrderedDict()  # least recently used first
        self.rejections = Counter(
            "prefixroute_tenant_rejections",
            "Requests refused by tenant checks, by the limit or check that refused them.",
            ["limit"],
            registry=registry,
        )

    # --- who ------------------------------------------------------------------------------
    def identify(self, headers: Mapping[str, str]) -> str:
        """The tenant of a request; raises Unauthorized or BadRequest."""
        if len(self.keys):
            tenant = self.keys.tenant_of(client_key(headers))
            if tenant is None:
                self.rejections.labels("api_key").inc()
                raise Unauthorized(
                    "a valid API key is required (Authorization: Bearer <key>, or x-api-key)"
                )
            return tenant
        named = headers.get(self.config.header)
        if named is None:
            return self.config.default_tenant
        if not TENANT_NAME.fullmatch(named):
            raise BadRequest(
                f"the {self.config.header} header must be 1-64 letters, digits or ._:@- "
                "(starting with a letter or digit)"
            )
        return named

    def get(self, name: str, now: float) -> Tenant:
        """The live tenant ``name``, made on first use; the least recently used idle ones are
        forgotten past ``max_tenants`` (a forgotten tenant comes back with full buckets)."""
        tenant = self._live.get(name)
        if tenant is not None:
            self._live.move_to_end(name)
            return tenant
        if len(self._live) >= self.config.max_tenants:
            self._forget_one()
        salt = self._salt(name)
        seed = BlockHasher().salted(salt).seed
        tenant = Tenant(name, salt, seed, TenantLimiter(name, self.limits_of(name), now))
        self._live[name] = tenant
        return tenant

    def _forget_one(self) -> None:
        for name, tenant in self._live.items():
            if tenant.limiter.in_flight == 0:
                del self._live[name]
                return
        # All busy: keep them; the gateway's own in-flight cap bounds how many that can be.

    def _salt(self, name: str) -> str:
        spec = self.config.spec(name)
        if spec is not None and spec.cache_salt is not None:
            return spec.cache_salt
        mac = hmac.new(self._secret, _SALT_CONTEXT + name.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    # --- limits ---------------------------------------------------------------------------
    def limits_of(self, name: str) -> TenantLimits:
        """Effective limits: the admin's override, else the tenant's entry, over the defaults."""
        override = self._overrides.get(name)
        if override is not None:
            return override.over(self.config.default_limits)
        spec = self.config.spec(name)
        own = spec.limits if spec is not None else TenantLimits()
        return own.over(self.config.default_limits)

    def set_limits(self, name: str, limits: TenantLimits | None, now: float) -> TenantLimits:
        """Override a tenant's limits (None: back to the config's); returns the effective."""
        if limits is None:
            self._overrides.pop(name, None)
        else:
            self._overrides[name] = limits
        effective = self.limits_of(name)
        live = self._live.get(name)
        if live is not None:
            live.limiter.configure(effective, now)
        return effective

    def describe(self, name: str, now: float) -> dict[str, Any]:
        live = self._live.get(name)
        if live is not None:
            out = live.limiter.describe(now)
        else:
            out = {"limits": self.limits_of(name).as_dict(), "in_flight": 0}
        spec = self.config.spec(name)
        out["name"] = name
        out["configured"] = spec is not None
        out["api_keys"] = len(spec.api_key_sha256) if spec is not None else 0
        out["overridden"] = name in self._overrides
        return out

    def names(self) -> list[str]:
        """Configured, overridden and live tenants."""
        seen = dict.fromkeys([t.name for t in self.config.tenants])
        seen.update(dict.fromkeys(self._overrides))
        seen.update(dict.fromkeys(self._live))
        return list(seen)

    def live_count(self) -> int:
        return len(self._live)


@dataclass(slots=True)
class TenantScope:
    """A request's tenant, as the proxy uses it."""

    tenant: Tenant
    tenants: Tenants

    def isolate_key(self, endpoint: Endpoint, key: RouteKey, obj: object) -> RouteKey:
        """``key`` as this tenant's: its name, and under isolation its seed (unless the request
        is shareable: then the common key space); sets or removes ``cache_salt`` in ``obj``,
        the parsed body that will be sent. Reads the routing text from ``key`` (call it before
        a tokenizer replaces the text with token ids), never from the body again."""
        cfg = self.tenants.config
        tenant = self.tenant
        if not cfg.isolation or endpoint is Endpoint.OTHER:
            return replace(key, tenant=tenant.name)
        if not isinstance(obj, dict):  # unreachable: routing refused non-objects already
            return replace(key, tenant=tenant.name, seed=tenant.seed)
        field = salt_field(endpoint)
        if cfg.shareable_prefixes and (key.text or "").startswith(cfg.shareable_prefixes):
            obj.pop(field, None)
            return replace(key, tenant=tenant.name, seed=None)
        obj[field] = tenant.salt
        return replace(key, tenant=tenant.name, seed=tenant.seed)

    def charge_prompt(self, tokens: int) -> None:
        try:
            self.tenant.limiter.charge_prompt(tokens, time.monotonic())
        except RateLimited as exc:
            self.tenants.rejections.labels(exc.limit).inc()
            raise

    def settle_prompt(self, charged: int, usage: Usage) -> None:
        """The replica's count of a prompt charged at ``charged`` (the router's estimate) sets
        the tenant's budget right: an estimate off by the model's characters per token (or an
        image counted as ten tokens) was never corrected, and one long prompt, counted at a
        ratio learned on short chats, kept its tenant out for an hour."""
        if usage.prompt_tokens is not None:
            now = time.monotonic()
            self.tenant.limiter.settle_prompt(charged, usage.prompt_tokens, now)


def isolated(scope: TenantScope | None) -> bool:
    """Whether the request whose scope this is (None: no tenant middleware) is under tenant
    isolation: its tenant's keys, salt and stored responses are its own."""
    return scope is not None and scope.tenants.config.isolation


def salt_field(endpoint: Endpoint) -> str:
    """The request field that namespaces a request's KV blocks in the engine: vLLM's (and
    SGLang's OpenAI) ``cache_salt``, and on SGLang's ``/generate`` its ``extra_key``, which its
    OpenAI server fills from ``cache_salt``."""
    return "extra_key" if endpoint is Endpoint.GENERATE else "cache_salt"


TENANT_SCOPE = web.RequestKey("prefixroute.tenant", TenantScope)
TENANTS = web.AppKey("prefixroute.gateway.tenants", Tenants)


def make_tenant_middleware(tenants: Tenants) -> Middleware:
    """Identify the tenant, admit it for the handler's duration, and leave its scope behind."""

    @web.middleware
    async def tenant_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path.startswith(OWN_AUTH_PREFIXES):
            return await handler(request)
        now = time.monotonic()
        tenant = tenants.get(tenants.identify(request.headers), now)
        try:
            tenant.limiter.admit(now)
        except RateLimited as exc:
            tenants.rejections.labels(exc.limit).inc()
            raise
        request[TENANT_SCOPE] = TenantScope(tenant, tenants)
        try:
            return await handler(request)
        finally:
            tenant.limiter.release()

    return tenant_middleware


def upstream_headers(
    client: CIMultiDictProxy[str], request_id: str, scope: TenantScope | None
) -> CIMultiDict[str]:
    """The headers a replica gets: the ``client``'s (less hop-by-hop ones), the request id, and
    the gateway's own upstream key in place of a client key the gateway itself checked."""
    headers = request_headers(client)
    if request_id:
        headers[REQUEST_ID_HEADER] = request_id
    tenants = scope.tenants if scope is not None else None
    if tenants is not None and (tenants.upstream_api_key is not None or len(tenants.keys)):
        # The client's key was for us, not the replica, in either header it may come in.
        headers.popall("Authorization", None)
        headers.popall(API_KEY_HEADER, None)
        if tenants.upstream_api_key is not None:  # vLLM's --api-key takes a bearer token only
            headers["Authorization"] = f"Bearer {tenants.upstream_api_key}"
    return headers
