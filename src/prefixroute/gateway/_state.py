"""The gateway's per-app objects, kept under one typed ``AppKey``.

Everything is built by :func:`prefixroute.gateway.build_app` and handed down; there is no
module-level state. ``proxy``, ``health`` and ``token_probe`` need the app's one
``ClientSession``, which exists only between startup and cleanup, so they are filled in by the
session's ``cleanup_ctx``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from prefixroute.core import Endpoint, RouteKey, Router
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._health import HealthChecker
from prefixroute.gateway._kv_report import ask_full_report
from prefixroute.gateway._limits import Limits
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._precise import PreciseMode
from prefixroute.gateway._proxy import Proxy
from prefixroute.gateway._registry import ReplicaRegistry
from prefixroute.gateway._responses import ResponseOwners
from prefixroute.gateway._tenants import TenantScope
from prefixroute.gateway._token_probe import TokenProbe
from prefixroute.gateway._tokenize import TokenizerPool
from prefixroute.gateway._tracing import RequestTracing
from prefixroute.gateway._usage import ask_for_stream_usage
from prefixroute.sync import RouteSync

log = logging.getLogger(__name__)

# Calls whose streams need no asking: every /generate chunk carries its meta_info, a Responses
# stream ends with its usage (response.completed), a Messages stream carries it in its
# message_start and message_delta events, and any other call is not read.
_OWN_USAGE = frozenset(
    {Endpoint.OTHER, Endpoint.GENERATE, Endpoint.RESPONSES, Endpoint.MESSAGES}
)


@dataclass(slots=True)
class GatewayState:
    config: GatewayConfig
    router: Router
    registry: ReplicaRegistry
    metrics: GatewayMetrics
    limits: Limits
    proxy: Proxy | None = None  # set while the app runs
    health: HealthChecker | None = None  # set while the app runs
    tokenizer: TokenizerPool | None = None  # with a tokenizer: token-exact keys
    precise: PreciseMode | None = None  # precise mode: the KV-event subscribers
    sync: RouteSync | None = None  # sync_redis: decisions shared with other instances
    tracing: RequestTracing | None = None  # otlp_endpoint: a span per routed request
    # approximate mode, while the app runs: models' characters per token asked of a replica
    token_probe: TokenProbe | None = None
    # stream_usage, until a replica refuses stream_options (stop_asking_stream_usage)
    asks_stream_usage: bool = True
    # Replicas that answered 200 to a stream we asked the usage of: they take stream_options.
    took_stream_usage: set[str] = dataclasses.field(default_factory=set)
    responses: ResponseOwners = dataclasses.field(default_factory=ResponseOwners)  # stored ones

    def probe_tokens(self, session: aiohttp.ClientSession) -> None:
        """Ask the replicas' ``/tokenize`` for each model's characters per token, over
        ``session``, until the app stops (``close_token_probe``): approximate mode only (a
        tokenizer counts exactly)."""
        if self.tokenizer is None:
            cfg = self.config
            self.token_probe = TokenProbe(
                self.registry, session, self.metrics.token_probes, cfg.health_timeout_s,
                cfg.upstream_api_key,
            )  # fmt: skip

    async def close_token_probe(self) -> None:
        """Stop the probes under way (before their session closes)."""
        probe, self.token_probe = self.token_probe, None
        if probe is not None:
            await probe.close()

    def shared_status(self) -> dict[str, Any]:
        """What /health says, beside the replicas, of the state this instance shares: the
        Redis sync (``sync``) and the KV-event streams (``kv_events``), each where configured.
        Neither fails the health check: without them the instance still routes, on its own
        view (the metrics and alerts carry the details)."""
        body: dict[str, Any] = {}
        if self.sync is not None:
            body["sync"] = self.sync.status()
        if self.precise is not None:
            body["kv_events"] = self.precise.states()
        return body

    def ask_stream_usage(self, endpoint: Endpoint, obj: object) -> bool:
        """Ask for the usage of a stream whose client did not (``_usage``), in the parsed body
        ``obj``, while the gateway asks; returns whether it did. Both front ends call this."""
        if endpoint in _OWN_USAGE or not self.asks_stream_usage:
            return False
        return ask_for_stream_usage(obj)

    def ask_full_kv_report(self, endpoint: Endpoint, obj: object) -> bool:
        """In precise mode, while a replica's KV-event stream is ``resyncing``, ask the engine
        to report the request's cached prefix again (``_kv_report``); returns whether it did.
        Both front ends call this."""
        if self.precise is None or not self.precise.recovering():
            return False
        return ask_full_report(endpoint, obj)

    def stream_usage_taken(self, replica: str) -> None:
        """``replica`` answered 200 to a stream whose usage we asked for."""
        self.took_stream_usage.add(replica)

    def stop_asking_stream_usage(self, replica: str) -> None:
        """``replica`` refused the ``stream_options`` we added (a server that rejects fields
        it does not know): no stream is asked for its usage from now on (logged once). Not
        when it took them before: then its 400 was the request's own fault, which may quote
        the whole body, our field included (vLLM's and SGLang's validation errors do), and
        one client's bad request would have turned the asking off for every stream."""
        if replica in self.took_stream_usage:
            return
        if self.asks_stream_usage:
            log.warning("%s refused stream_options: no more usage asked of streams", replica)
            self.asks_stream_usage = False

    async def route_key(
        self, endpoint: Endpoint, key: RouteKey, obj: object | None, scope: TenantScope | None
    ) -> RouteKey:
        """``key`` (parsed from ``obj``) as the router sees it: in its tenant's key space
        (which sets or removes ``cache_salt`` in ``obj``), with its LoRA adapter, and tokenized
        last, since tenancy reads its text. The proxied path and ``/admin/explain`` both key
        requests here."""
        if scope is not None:
            key = scope.isolate_key(endpoint, key, obj)
        # The adapter a /generate request names itself (lora_path), else the model's.
        adapter = key.adapter if key.adapter is not None else self.registry.adapter_of(key.model)
        if adapter != key.adapter:  # most keys already have it (None): no copy on their path
            key = dataclasses.replace(key, adapter=adapter)
        if self.tokenizer is not None and endpoint is not Endpoint.OTHER:
            key = await self.tokenizer.key(key)
        if self.token_probe is not None:  # a text key of a model whose ratio nobody told yet
            await self.token_probe.ready(key)
        return key


STATE = web.AppKey("prefixroute.gateway.state", GatewayState)
