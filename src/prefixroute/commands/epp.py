"""``prefixroute epp``: the endpoint picker until SIGINT/SIGTERM (docs/kubernetes.md).

Endpoints come from ``--endpoint`` flags and the config file's ``replicas``, from
``--endpoints-file`` (re-read when it changes), or from Kubernetes pods (``--k8s-selector``, or
``--pool-name``: the pods an ``InferencePool`` selects, as the reference picker finds them).
Routing and health settings are the gateway's, from the same ``--config`` TOML file, and so
are the Redis sync (``--sync-redis``, ``sync_channel``: several pickers, and gateways, on one
channel share one index and load view), the tenants (the ``[tenancy]`` table; the upstream key
from ``$PREFIXROUTE_UPSTREAM_API_KEY`` or ``upstream_api_key_file``), token-exact keys
(``--tokenizer``) and precise mode (``--kv-events``). ``--fallbacks N`` names up to N more
endpoints after the primary, for proxies that retry down the protocol's list.
``--print-envoy-config`` prints an Envoy bootstrap to run it behind, and exits.
``--replica-speed IP:PORT=prefill_tokens_per_s=N`` gives an endpoint's own speed priors, as
serve's does, whichever source brings it; a pod's annotations give its own (docs/kubernetes.md).
``--ha-enable-leader-election`` runs several pickers active-passive, as the Inference
Extension's picker does: they contend for a Kubernetes Lease and only the leader reports ready
(``prefixroute.epp._leader``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from prefixroute._serving import run_on_uvloop, wait_for_signal
from prefixroute.commands._args import bind_host, flags
from prefixroute.commands._epp_reference import add_reference_args, go_bool, warn_ignored
from prefixroute.commands._settings import add_setting_flags
from prefixroute.core import ConfigError, ReplicaId, SpeedPrior
from prefixroute.epp import (
    LEASE_NAME,
    MAX_REQUESTS,
    V1_GROUP,
    EndpointPicker,
    EnvoyConfig,
    EppConfig,
    InferencePoolPods,
    KubernetesPods,
    LeaseElector,
    PodEndpoints,
    PodSource,
    endpoint_of,
    envoy_bootstrap,
    load_cluster_config,
    replica_of,
)
from prefixroute.gateway import (
    ADMIN_TOKEN_ENV,
    SYNC_SECRET_ENV,
    UPSTREAM_API_KEY_ENV,
    build_config,
    by_replica,
    load_toml,
)
from prefixroute.sync import redacted

log = logging.getLogger("prefixroute.epp")
# The gateway settings that are epp flags too (any other comes from the --config file).
ROUTING_FLAGS = (
    "block_chars",
    "kv_block_size",
    "health_interval_s",
    "tokenizer",
    "kv_events",
    "kv_events_each",
    "speculative_ttl_s",
    "sync_redis",
    "sync_history",
    "replica_speeds",
)


def add_parser(subparsers: Any) -> None:
    d = EppConfig()
    p: argparse.ArgumentParser = subparsers.add_parser(
        "epp",
        help="run as an Envoy ext_proc endpoint picker (Gateway API Inference Extension)",
        description="An Envoy external-processing server that picks, per request, the endpoint "
        "most likely to hold its prefix: the endpoint picker protocol of the Gateway API "
        "Inference Extension (v1.0.0). Envoy routes with the x-gateway-destination-endpoint "
        "header (an ORIGINAL_DST cluster) or the envoy.lb metadata.",
    )
    p.add_argument(
        "--endpoint", action="append", dest="endpoints", metavar="IP:PORT", help="a model server"
    )
    p.add_argument(
        "--endpoints-file", metavar="FILE", help="one IP:PORT per line, re-read when it changes"
    )
    p.add_argument("--config", metavar="FILE", help="TOML file of gateway settings (serve's)")
    add_setting_flags(p, ("policy",))  # the gateway's own flags, from GatewayConfig
    p.add_argument(
        "--grpc-host", default=d.grpc_host, type=bind_host, help=f"default {d.grpc_host}"
    )
    p.add_argument("--grpc-port", type=int, default=d.grpc_port, help=f"default {d.grpc_port}")
    p.add_argument(
        "--http-host", default=d.http_host, type=bind_host, help=f"metrics address ({d.http_host})"
    )
    p.add_argument(
        "--http-port", type=int, default=d.http_port, help=f"metrics/health port ({d.http_port})"
    )
    add_setting_flags(p, ROUTING_FLAGS)
    p.add_argument(
        "--fallbacks",
        type=int,
        default=d.fallbacks,
        metavar="N",
        help="also name up to N fallback endpoints after the primary (ip:port,ip:port,...), for "
        "a proxy that retries down the list (Envoy's override_host policy); 0, the default, "
        "sends one endpoint, the only form an ORIGINAL_DST cluster reads",
    )
    p.add_argument(
        "--buffered",
        action="store_true",
        help="assume BUFFERED request bodies when Envoy does not say (default full duplex)",
    )
    _add_envoy_args(p)
    add_reference_args(p)
    _add_kubernetes_args(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(run=run)


def _add_kubernetes_args(p: argparse.ArgumentParser) -> None:
    """Pod discovery and leader election: what needs the ``kubernetes`` extra."""
    k = p.add_argument_group("Kubernetes: discovery, leader election (the kubernetes extra)")
    k.add_argument("--k8s-selector", metavar="LABELS", help="pod label selector, e.g. app=vllm")
    k.add_argument("--k8s-namespace", default="default", help="the pods' namespace")
    k.add_argument("--k8s-target-port", type=int, help="the model servers' port on each pod")
    k.add_argument("--k8s-resync", type=int, default=60, help="full relist period, s (60)")
    k.add_argument(
        "--pool-name",
        metavar="NAME",
        help="the InferencePool whose pods to watch: its selector and target ports, re-read at "
        "each resync (instead of --k8s-selector and --k8s-target-port)",
    )
    k.add_argument(
        "--pool-namespace", metavar="NS", help="its namespace ($NAMESPACE, else --k8s-namespace)"
    )
    k.add_argument(
        "--pool-group", default=V1_GROUP, help=f"the pool's API group (default {V1_GROUP}; the "
        "v1alpha2 pools': inference.networking.x-k8s.io)",
    )  # fmt: skip
    k.add_argument(
        "--ha-enable-leader-election",
        nargs="?",
        const=True,
        default=False,
        type=go_bool,
        metavar="BOOL",
        help="contend for a Lease with the other pickers: only the leader reports ready (the "
        "Inference Extension picker's flag; =false, as charts may pass it, is off)",
    )
    k.add_argument(
        "--leader-election-id", default=LEASE_NAME, help=f"the Lease's name ({LEASE_NAME})"
    )
    k.add_argument(
        "--leader-election-namespace", metavar="NS", help="the Lease's namespace (--k8s-namespace)"
    )


def _add_envoy_args(p: argparse.ArgumentParser) -> None:
    """``--print-envoy-config`` and what it prints."""
    e = p.add_argument_group("an Envoy to run it behind")
    e.add_argument(
        "--print-envoy-config",
        action="store_true",
        help="print an Envoy bootstrap (YAML) whose listener asks this picker (at --grpc-host "
        "and --grpc-port) and fails closed without it, then exit; with --fallbacks, the "
        "--endpoint list becomes an override_host cluster that retries down the picker's list",
    )
    e.add_argument(
        "--envoy-listen",
        default="0.0.0.0:8081",
        metavar="HOST:PORT",
        help="with --print-envoy-config: where Envoy takes requests (0.0.0.0:8081)",
    )
    e.add_argument(
        "--envoy-admin-port",
        type=int,
        default=9901,
        metavar="PORT",
        help="with --print-envoy-config: Envoy's admin interface, on 127.0.0.1 (9901; 0: any "
        "free port, for a second Envoy on the host)",
    )
    e.add_argument(
        "--envoy-max-requests",
        type=int,
        default=MAX_REQUESTS,
        metavar="N",
        help="with --print-envoy-config: requests in flight through Envoy at once, every "
        "cluster's circuit breakers (65536; Envoy's own default, 1024, answers the next one 500)",
    )


def config_from_args(args: argparse.Namespace) -> EppConfig:
    file_settings = load_toml(args.config) if args.config else {}
    endpoints = [replica_of(e) for e in args.endpoints or ()]  # ConfigError on a bad one
    routing = build_config(
        file_settings,
        replicas=endpoints,
        # Secrets as serve reads them: from the environment (or the file), never from argv.
        admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None,  # the fleet page, admin listing
        upstream_api_key=os.environ.get(UPSTREAM_API_KEY_ENV) or None,  # the replicas' key
        sync_secret=os.environ.get(SYNC_SECRET_ENV) or None,  # sync_redis's signatures
        **flags(args, "policy", *ROUTING_FLAGS),
    )
    if args.k8s_selector and args.pool_name:
        raise ConfigError("give --k8s-selector or --pool-name, not both (the pool has a selector)")
    if args.cert_path and not args.secure_serving:
        raise ConfigError("--cert-path is for --secure-serving (the gRPC port is plaintext)")
    if args.pool_name and args.k8s_target_port is not None:
        raise ConfigError("--pool-name takes the pool's target ports: drop --k8s-target-port")
    if args.k8s_selector and args.k8s_target_port is None:
        raise ConfigError("--k8s-selector needs --k8s-target-port (the pool's target port)")
    if not (args.endpoints_file or args.k8s_selector or args.pool_name):  # none can join later
        if not routing.replicas:  # it started with "0 endpoints", and no word why
            log.warning("no endpoint: none given (--endpoint) and nowhere to find any "
                        "(--endpoints-file, --k8s-selector, --pool-name): every pick fails")
        # Priors for an address that is not listed are a typo when the list is all there will
        # be: refused, as serve refuses them.
        by_replica(
            routing.replica_speed_priors(), routing.replicas, "speed priors",
            id_of=replica_of, known_as="an --endpoint",
        )
    return EppConfig(
        routing=routing,
        full_duplex=not args.buffered,
        leader_election=args.ha_enable_leader_election,
        grpc_health_port=args.grpc_health_port,
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        cert_reload=args.enable_cert_reload,
        **flags(
            args, "grpc_host", "grpc_port", "http_host", "http_port", "endpoints_file", "fallbacks"
        ),
    )


def envoy_config_of(
    config: EppConfig, listen: str, max_requests: int = MAX_REQUESTS, admin_port: int = 9901
) -> EnvoyConfig:
    """The Envoy in front of ``config``'s picker: its pool listed only when the picker names
    fallbacks (``override_host``; else ``ORIGINAL_DST`` follows the picker's one endpoint)."""
    if config.secure_serving:  # the bootstrap's ext_proc cluster speaks plaintext
        raise ConfigError("--print-envoy-config prints an Envoy that speaks plaintext to the "
                          "picker: drop --secure-serving")  # fmt: skip
    host = config.grpc_host if config.grpc_host not in ("0.0.0.0", "::") else "127.0.0.1"
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host  # IPv6
    listed = config.routing.replicas if config.fallbacks else ()
    return EnvoyConfig(
        pickers=[f"{host}:{config.grpc_port}"],
        endpoints=[endpoint_of(ReplicaId(r)) for r in listed],
        listen=listen,
        body_mode="FULL_DUPLEX_STREAMED" if config.full_duplex else "BUFFERED",
        max_requests=max_requests,
        admin_port=admin_port,
        upstream_idle_timeout_s=config.routing.upstream_idle_timeout_s,  # as serve's pool
        max_body_bytes=config.routing.max_body_bytes,  # BUFFERED: Envoy holds bodies that big
    )


def run(args: argparse.Namespace) -> int:
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)
    warn_ignored(args, log)
    if args.print_envoy_config:
        envoy = envoy_config_of(
            config, args.envoy_listen, args.envoy_max_requests, args.envoy_admin_port
        )
        print(envoy_bootstrap(envoy), end="")
        return 0
    pods = _pod_source(args)
    lease = None
    if config.leader_election:
        load_cluster_config("--ha-enable-leader-election")  # a one-line error here, not later
        lease = (args.leader_election_id, args.leader_election_namespace or args.k8s_namespace)
    run_on_uvloop(_serve(config, pods, args.k8s_resync, lease))  # uvloop when installed
    return 0


async def _serve(
    config: EppConfig,
    pods: tuple[PodSource, int | None, str] | None,
    resync_s: int,
    lease: tuple[str, str] | None = None,
) -> None:
    epp = EndpointPicker(config)
    if pods is not None:
        epp.discovery = f"Kubernetes discovery ({pods[2]})"
    async with epp:
        watcher = None
        if pods is not None:
            loop = asyncio.get_running_loop()

            def publish(endpoints: dict[str, SpeedPrior | None]) -> None:
                loop.call_soon_threadsafe(epp.endpoints.apply, endpoints)

            watcher = PodEndpoints(pods[0], pods[1], publish, resync_s=resync_s)
            watcher.start()
        elector = _elect(epp, *lease) if lease is not None else None
        log.info("metrics on http://%s:%d/metrics", config.http_host, epp.http_port)
        if config.routing.sync_redis is not None:
            log.info("sharing decisions through %s", redacted(config.routing.sync_redis))
        try:
            await wait_for_signal()
        finally:
            if elector is not None:  # first: a released Lease lets a standby take over at once
                await asyncio.to_thread(elector.stop)
            if watcher is not None:
                watcher.stop()


def _pod_source(args: argparse.Namespace) -> tuple[PodSource, int | None, str] | None:
    """The pods to watch (source, target port, what they are), or None: no Kubernetes."""
    if args.pool_name:
        namespace = args.pool_namespace or os.environ.get("NAMESPACE") or args.k8s_namespace
        pool = InferencePoolPods(namespace, args.pool_name, args.pool_group)
        return pool, None, f"the pods of InferencePool {namespace}/{args.pool_name}"
    if args.k8s_selector:
        pods = KubernetesPods(args.k8s_namespace, args.k8s_selector)
        return pods, args.k8s_target_port, f"pods {pods.selector} in {pods.namespace}"
    return None


def _elect(epp: EndpointPicker, name: str, namespace: str) -> LeaseElector:
    """Contend for the Lease; each change of leadership reaches the picker on its loop."""
    loop = asyncio.get_running_loop()

    def on_change(leading: bool) -> None:
        asyncio.run_coroutine_threadsafe(epp.lead(leading), loop)

    elector = LeaseElector(name, namespace, on_change)
    log.info("contending for Lease %s/%s as %s", namespace, name, elector.identity)
    elector.start()
    return elector
