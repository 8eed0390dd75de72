"""The picker's servers: ext_proc and gRPC health on one port, metrics and admin on another.

One asyncio loop runs everything (``grpc.aio``, aiohttp, the health probes), so the router,
which is not thread-safe, is only ever touched from that loop. The Kubernetes watcher runs the
blocking client in a thread and hands each new endpoint set to the loop.

The HTTP side is the gateway's admin listener (``gateway.admin_listener``, what ``serve
--admin-port`` runs) with two public paths added: ``GET /metrics`` (the gateway's Prometheus
registry: decisions, requests by replica/status/reason, predicted against actual cached tokens,
the live index and load) and ``GET /health`` (200 while some endpoint is healthy, else 503).
The rest is ``serve``'s, same handlers and rules: with an admin token, the admin API (replicas
listed and drained, tenants' limits read and set, ``/admin/explain``), bearer token only, a
JSON 401 without it; the fleet page with the token, or without one on a loopback listener for
loopback clients; no admin API without a token. One difference: adding or removing an endpoint
answers 409, since the endpoints are the discovery source's (the ``--endpoint`` list, the
endpoints file, Kubernetes pods), which would undo the change (:meth:`EndpointPicker.membership`).

The router, registry, metrics, Redis sync, tokenizer threads and precise mode's KV-event
subscribers are the gateway's own, built by the gateway's wiring (``gateway.gateway_state``)
from the same ``GatewayConfig``, and so are the tenants (``gateway.Tenants``, the ``[tenancy]``
table): what ``serve`` does with a setting, the picker does with it too. With ``sync_redis``
the picker joins the gateways' Redis sync (same channel, same messages): it publishes its
decisions, first tokens and ends, and applies the other pickers' and gateways', on this loop.
With ``tokenizer`` it keys requests on the engines' token ids; with ``kv_events`` (precise
mode, which needs the tokenizer) the prefix index follows the replicas' KV events, one stream
per configured endpoint, fixed at start as in ``serve``: endpoints discovered later get none.

Run active-passive (``leader_election``, ``--ha-enable-leader-election``: ``_leader``), the gRPC
health answers as the Inference Extension's picker does: ``liveness`` always serving, the rest
(``""``, ``readiness``, the ext_proc service) only while this picker leads; ``/health`` says
``leader`` too and is 503 on a standby, and ``prefixroute_epp_leader`` is 1 on the leader. A
standby still answers a pick it is asked for.

Fail-closed by default: the Envoy configurations we ship set ``failure_mode_allow: false``, so
with the picker down Envoy answers 500 rather than sending requests nowhere in particular.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from prefixroute._serving import listen
from prefixroute.core import ConfigError, ReplicaId
from prefixroute.epp import _protocol as proto
from prefixroute.epp._candidates import replica_of
from prefixroute.epp._endpoints import EndpointSet, FileEndpoints
from prefixroute.epp._envoy_config import MAX_REQUESTS, buffered_body_bytes
from prefixroute.epp._shared import PickShared
from prefixroute.epp._stream import PickStream
from prefixroute.epp._tls import server_credentials
from prefixroute.events import EventSubscriber
from prefixroute.gateway import (
    GatewayConfig,
    HealthChecker,
    HFTokenizer,
    PromptTokenizer,
    Tenants,
    admin_listener,
    gateway_state,
)

log = logging.getLogger(__name__)

# gRPC's core sheds new calls that wait for the server to take them: past 1,000 waiting, each
# is cancelled at random, more likely as the queue nears 3,000 (random early detection). Every
# request Envoy admits opens one stream at once, so a burst of a thousand requests (a few
# seconds of a busy fleet's arrivals after a picker restart) left some of them CANCELLED, which
# Envoy answers 500 (2 to 4 of 1,100 on a 2-vCPU VM, 2026-12-01). The queue may grow as far as
# Envoy lets requests in: its circuit breakers in the bootstrap we ship (``MAX_REQUESTS``).
# gRPC binds with SO_REUSEPORT unless told not to: a second picker started on a taken port came
# up without a word and took half of the first one's streams, each with its own index and load.
_GRPC_SERVER_OPTIONS = [
    ("grpc.server.max_pending_requests", MAX_REQUESTS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_REQUESTS),
    ("grpc.so_reuseport", 0),
]
# The HTTP side answers probes, scrapes and the fleet page: at stop, what is still open after this
# is cut (the gateway's admin listener does the same).
HTTP_CLOSE_TIMEOUT_S = 0.25
MAX_GRACE_S = 86_400.0  # shutdown_timeout_s = inf: gRPC's stop takes a number


@dataclass(frozen=True, slots=True)
class EppConfig:
    """The picker's own settings; routing, health and limits come from ``routing`` (the same
    ``GatewayConfig`` fields, TOML keys and defaults as ``prefixroute serve``)."""

    routing: GatewayConfig = field(default_factory=GatewayConfig)  # its replicas: static list
    grpc_host: str = "127.0.0.1"  # ext_proc and gRPC health listener address
    grpc_port: int = 9002  # the Inference Extension's conventional EPP port; 0: any free one
    http_host: str = "127.0.0.1"  # metrics/health/admin listener address
    http_port: int | None = 9090  # None: no HTTP listener; 0: any free port
    endpoints_file: str | None = None  # one ip:port per line, re-read when it changes
    full_duplex: bool = True  # body mode assumed when Envoy does not send its protocol_config
    fallbacks: int = 0  # endpoints after the primary (the protocol's list); 0: ORIGINAL_DST's one
    leader_election: bool = False  # active-passive (docstring): ready only while leading
    # gRPC health on a port of its own too, plaintext (the reference picker's 9003, which its
    # chart's probes ask); None: on grpc_port only; 0: any free port.
    grpc_health_port: int | None = None
    secure_serving: bool = False  # TLS on grpc_port (_tls): cert_path's, else self-signed
    cert_path: str | None = None  # a folder with tls.crt and tls.key
    cert_reload: bool = False  # read cert_path again when it changes (_tls.ReloadingCertificate)

    def __post_init__(self) -> None:
        if self.fallbacks < 0:
            raise ConfigError(f"fallbacks must be 0 or more, got {self.fallbacks}")
        ports = {"grpc_port": self.grpc_port, "http_port": self.http_port,
                 "grpc_health_port": self.grpc_health_port}  # fmt: skip
        for name, port in ports.items():  # gRPC binds port % 65536: 70000 listened on 4464
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{name} out of range (0-65535): {port}")
        if self.grpc_port == self.http_port != 0 and self.grpc_host == self.http_host:
            raise ConfigError(f"grpc_port and http_port are both {self.grpc_port}: one each")


class _Processor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, shared: PickShared) -> None:
        self.shared = shared

    async def Process(  # noqa: N802 (gRPC's method name)
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        # The context's read and write rather than an async generator over ``requests``: on a
        # servicer that only answers, four exchanges a stream cost about 650 us of server CPU
        # this way on uvloop against 840 as a generator on asyncio's loop (2-vCPU VM).
        stream = PickStream(self.shared)
        try:
            while (req := await context.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                for resp in await stream.handle(req):
                    await context.write(resp)
        except Exception:
            # The proxy cancelled the stream between our read and our write (a client gone):
            # gRPC's write then raises its internal ExecuteBatchError, which it logged as a
            # servicer's traceback at ERROR (about 1 cancel in 3,000: an outside audit).
            if not (context.cancelled() or context.done()):
                raise
        finally:
            stream.close()


class EndpointPicker:
    """``async with EndpointPicker(config) as epp:`` serves until the block ends."""

    def __init__(self, config: EppConfig, tokenizer: PromptTokenizer | None = None) -> None:
        """``tokenizer`` overrides ``config.routing.tokenizer`` (tests pass one that matches
        their replicas), as ``gateway.build_app`` takes it."""
        self.config = config
        # A source of endpoints the config does not show, named before start (``prefixroute
        # epp``: the Kubernetes pods it watches), for the admin API's refusals (membership).
        self.discovery: str | None = None
        rc = config.routing
        if tokenizer is None and rc.tokenizer is not None:
            tokenizer = HFTokenizer(rc.tokenizer)
        rc.check_precise(tokenizer is not None)
        # Speed priors may name endpoints a file or the pods bring later: kept until they join.
        speeds = {replica_of(url): prior for url, prior in rc.replica_speed_priors().items()}
        self.state = gateway_state(rc, tokenizer, speeds)  # router, registry, metrics, sync...
        self.router = self.state.router
        self.registry = self.state.registry
        self.metrics = self.state.metrics
        self.sync = self.state.sync  # sync_redis: one view with the other pickers
        self.tenants = Tenants(rc.tenancy, rc.upstream_api_key, self.metrics.registry)
        self.shared = PickShared(
            self.state, self.tenants, config.full_duplex, fallbacks=config.fallbacks,
            later=lambda end: asyncio.get_running_loop().call_soon(end),
        )  # fmt: skip
        self.endpoints = EndpointSet(self.registry, self._probe_new)
        self.grpc_port = self.grpc_health_port = self.http_port = 0  # bound ports, after start
        self._grpc: grpc.aio.Server | None = None
        self._grpc_health: grpc.aio.Server | None = None  # the health-only listener
        self._health = HealthServicer()
        self._session: aiohttp.ClientSession | None = None
        self._checker: HealthChecker | None = None
        self._runner: web.AppRunner | None = None
        self._file: FileEndpoints | None = None
        self._probes: set[asyncio.Task[bool]] = set()
        self.leading = not config.leader_election  # without an election every picker leads
        self._leader_gauge = Gauge(
            "prefixroute_epp_leader",
            "1 while this picker leads (always, without --ha-enable-leader-election)",
            registry=self.metrics.registry,
        )
        self._leader_gauge.set(int(self.leading))
        self._health_lock = asyncio.Lock()

    @property
    def address(self) -> str:
        return f"{self.config.grpc_host}:{self.grpc_port}"

    async def start(self) -> None:
        cfg = self.config
        self.endpoints.apply(cfg.routing.replicas)  # before the checker: probed just below
        if cfg.endpoints_file is not None:
            self._file = FileEndpoints(cfg.endpoints_file, self.endpoints)
            self._file.start()
        self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())  # as serve
        self.state.probe_tokens(self._session)  # approximate mode: /tokenize's counts
        self._checker = HealthChecker(self.registry, self._session, cfg.routing)
        await self._checker.check_all(first=True)
        self._checker.start()
        if self.state.precise is not None:
            await self.state.precise.start()
        if self.sync is not None:
            await self.sync.start()  # never fails: an unreachable Redis is retried in background
        credentials = (
            server_credentials(cfg.cert_path, cfg.cert_reload) if cfg.secure_serving else None
        )
        big = ("grpc.max_receive_message_length", buffered_body_bytes(cfg.routing.max_body_bytes))
        server = self._grpc = grpc.aio.server(options=[*_GRPC_SERVER_OPTIONS, big])  # not 4 MiB
        pb_grpc.add_ExternalProcessorServicer_to_server(_Processor(self.shared), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.grpc_port = _bind_grpc(server, cfg.grpc_host, cfg.grpc_port, credentials)
        await server.start()
        if cfg.grpc_health_port is not None:
            health = self._grpc_health = grpc.aio.server(options=_GRPC_SERVER_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(self._health, health)
            self.grpc_health_port = _bind_grpc(health, cfg.grpc_host, cfg.grpc_health_port)
            await health.start()
        await self._set_health()
        if cfg.http_port is not None:
            self._runner, url = await listen(
                self._http_app(), cfg.http_host, cfg.http_port,
                shutdown_timeout_s=HTTP_CLOSE_TIMEOUT_S,
            )  # fmt: skip
            self.http_port = int(url.rsplit(":", 1)[1])
        log.info(
            "endpoint picker (protocol %s) on %s, %d endpoints",
            proto.PROTOCOL_VERSION, self.address, len(self.registry),
        )  # fmt: skip

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving; the calls under way get ``grace_s`` to end (then they are cut)."""
        for service in proto.HEALTH_SERVICES:
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
            self._grpc = None
        if self._grpc_health is not None:
            await self._grpc_health.stop(0)
            self._grpc_health = None
        if self._file is not None:
            await self._file.stop()
        for task in list(self._probes):
            task.cancel()
        if self._checker is not None:
            await self._checker.stop()
        if self.sync is not None:
            await self.sync.stop()
        await self._stop_state()
        if self._runner is not None:
            await self._runner.cleanup()  # listen()'s: stops accepting first
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def lead(self, leading: bool) -> None:
        """This picker now leads (True) or stands by (False): its readiness follows."""
        self.leading = leading
        self._leader_gauge.set(int(leading))
        if self._grpc is not None:
            await self._set_health()

    async def _set_health(self) -> None:
        """Every health service as :attr:`leading` says now (``liveness`` always serving). One
        at a time: a change that comes while one is being written is written after it."""
        status = health_pb2.HealthCheckResponse
        async with self._health_lock:
            for service in proto.HEALTH_SERVICES:
                ready = self.leading or service == proto.LIVENESS
                await self._health.set(service, status.SERVING if ready else status.NOT_SERVING)

    async def _stop_state(self) -> None:
        """What the gateway's app stops with it: event streams, tokenizer threads, tracing."""
        state = self.state
        await state.close_token_probe()
        if state.precise is not None:
            await state.precise.stop()
        if state.tokenizer is not None:
            state.tokenizer.shutdown()
        if state.tracing is not None:
            state.tracing.shutdown()

    @property
    def event_streams(self) -> dict[ReplicaId, EventSubscriber]:
        """Precise mode's KV-event subscriber per replica (empty in the other modes)."""
        precise = self.state.precise
        return dict(precise.subscribers) if precise is not None else {}

    async def __aenter__(self) -> EndpointPicker:
        try:
            await self.start()
        except BaseException:
            await self.stop(0)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        # As serve drains: calls under way (a stream's, while it runs) get shutdown_timeout_s;
        # at 5 s a rolling update cut every longer generation. New ones: NOT_SERVING at once.
        await self.stop(min(self.config.routing.shutdown_timeout_s, MAX_GRACE_S))

    def _probe_new(self, record: Any) -> None:
        """A new endpoint is probed at once (it starts unhealthy until it answers)."""
        if self._checker is None:
            return  # before start: start's first round probes everything
        task = asyncio.get_running_loop().create_task(self._checker.check(record, first=True))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    # --- HTTP: metrics, health, the admin API and the fleet page ----------------------------
    def membership(self) -> str:
        """Why the admin API does not add or remove endpoints here (its 409's message): the
        discovery source owns them, and would undo such a change (a static list at the next
        start); the proxy's own pool would not follow it either."""
        file = self.config.endpoints_file
        if self.discovery is not None:
            source = self.discovery
        elif file is not None:
            source = f"the endpoints file {file}"
        else:
            source = "the --endpoint list"
        return (
            f"the picker's endpoints belong to {source}, which would undo a change made here: "
            "change them there (draining one works)"
        )

    def _http_app(self) -> web.Application:
        """``/metrics`` and ``/health`` (probes, Prometheus) for anyone; the rest as the
        gateway's admin listener serves it (see the module doc)."""
        public = [web.get("/metrics", self._metrics), web.get("/health", self._healthz)]
        app, self.shared.fleet = admin_listener(
            self.state, self.tenants, self.config.http_host,
            routes=public, membership_refusal=self.membership(),
        )  # fmt: skip
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        healthy = sum(1 for r in self.registry if r.healthy and not r.draining)
        status = 200 if healthy and self.leading else 503
        body: dict[str, Any] = {"healthy_endpoints": healthy}
        if self.config.leader_election:
            body["leader"] = self.leading
        body.update(self.state.shared_status())
        return web.json_response(body, status=status)


def _bind_grpc(
    server: grpc.aio.Server, host: str, port: int, tls: grpc.ServerCredentials | None = None
) -> int:
    """Bind ``server`` on ``host:port`` (with ``tls``, if given) and return the port (0 picks
    one). A port that cannot be
    bound is a :class:`ConfigError` naming it and why, as :func:`prefixroute._serving.listen`
    says it for HTTP. gRPC itself only says that binding failed (and logs its own line on
    stderr), so the kernel is asked first, with a plain socket bound as gRPC binds."""
    why = _bind_failure(host, port)
    if why is None:
        try:
            if tls is not None:
                return server.add_secure_port(f"{host}:{port}", tls)
            return server.add_insecure_port(f"{host}:{port}")
        except RuntimeError:  # taken between the two binds
            why = "the address could not be bound"
    raise ConfigError(f"cannot listen on {host}:{port}: {why}")


def _bind_failure(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound, in ``os.strerror``'s words; None if it can."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return str(exc.strerror or exc).lower()
    family, kind, _, _, address = infos[0]
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(address)
        except OSError as exc:
            return os.strerror(exc.errno or errno.EINVAL).lower()
    return None
