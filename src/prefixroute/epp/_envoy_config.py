"""An Envoy bootstrap that puts the picker in front of a pool: the configuration the picker's
tests run against a real Envoy, for anyone who runs Envoy themselves
(``prefixroute epp --print-envoy-config``). A Gateway implementation with InferencePool support
(Envoy Gateway, kgateway, Istio, GKE) writes its own and needs none of this.

What it sets, and why (docs/kubernetes.md, "The Envoy side"):

- the HTTP filter ``envoy.filters.http.ext_proc`` asking the picker over an HTTP/2 cluster,
  headers and trailers ``SEND``, both bodies ``FULL_DUPLEX_STREAMED`` (or ``BUFFERED``) as the
  protocol asks, and the ``envoy.lb`` metadata namespaces forwarded and received;
- ``failure_mode_allow: false``: with the picker down, Envoy answers 500 and sends nothing
  upstream (fail closed: an ``ORIGINAL_DST`` cluster with no destination has nowhere to go);
- the pool: with no endpoints listed, ``ORIGINAL_DST`` reading the destination header (one
  address); with them, a static cluster whose load balancer is ``override_host`` reading the
  header as the protocol's list, with a route retry policy to go down it
  (``prefixroute epp --fallbacks N``);
- every cluster's circuit breakers at ``max_requests`` (65,536) requests, connections and
  retries: Envoy's defaults (1,024, and 3 retries) answer the next concurrent request 500, and
  a crash's rescues beyond the third 503 (``_LIMITS``);
- the pool's idle connections closed after ``upstream_idle_timeout_s`` (4 s), before the
  engines' own keep-alive timeout closes them, and a request reset before its answer sent once
  more (``STALE_RETRY``; with fallbacks, down the picker's list): a request written on a pooled
  connection as the replica closed it was answered 503;
- with ``trace``: the served endpoint sent to the picker with the response (ext_proc's
  ``upstream.address`` attribute) and an access log line per request.

Without a picker (``pickers`` empty) it is the same listener with Envoy's own round robin over
the endpoints: the baseline ``benchmarks/epp_overhead.py`` measures the picker against.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from prefixroute._pool import IDLE_TIMEOUT_S
from prefixroute.core import ConfigError
from prefixroute.epp._protocol import DESTINATION_HEADER

_FILTERS = "type.googleapis.com/envoy.extensions.filters."
_LB = "type.googleapis.com/envoy.extensions.load_balancing_policies."
HCM = _FILTERS + "network.http_connection_manager.v3.HttpConnectionManager"
EXT_PROC = _FILTERS + "http.ext_proc.v3.ExternalProcessor"
ROUTER = _FILTERS + "http.router.v3.Router"
BODY_MODES = ("FULL_DUPLEX_STREAMED", "BUFFERED")
# One line a request: what the picker named, the host that served it, the status, attempts,
# and Envoy's response flags (why it answered itself: UF, URX, UO, ...; "-" when it did not).
ACCESS_FORMAT = (
    f"%REQ({DESTINATION_HEADER})% %UPSTREAM_HOST% %RESPONSE_CODE% %UPSTREAM_REQUEST_ATTEMPT_COUNT%"
    " %RESPONSE_FLAGS%"
)
# Go down the picker's list on a refused connection or a reset before the answer.
RETRY = ", retry_policy: {retry_on: 'connect-failure,reset', num_retries: 3}"
# With one endpoint named (ORIGINAL_DST) or none (round robin): once more on a reset before the
# answer, the race of a pooled connection that the replica closed as the request went out on it
# (its keep-alive timeout: a request it never read; Envoy answered 503, "connection
# termination"). ORIGINAL_DST sends it to the same replica again, on another connection.
STALE_RETRY = ", retry_policy: {retry_on: reset, num_retries: 1}"
_POOL_HTTP = """\
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        common_http_protocol_options: {{idle_timeout: {idle}}}
        explicit_http_config: {{http_protocol_options: {{}}}}
"""
# Every cluster's circuit breakers (per priority), all at ``EnvoyConfig.max_requests``. Envoy's
# defaults are 1,024 connections, pending and parallel requests, and 3 retries at once:
# - each request in flight holds a stream to the picker for its whole length (the picker reads
#   the answer), so the 1,025th concurrent generation was answered 500 with an empty body, and
#   one connection to the pool each (HTTP/1), so the pool's limits cap the fleet the same way;
# - a replica that crashes under load fails every request it held, and every one picked for it
#   until the picker's probes see it gone, at once: from the 4th retry on Envoy answered 503
#   (flags UO,UF) instead of going down the picker's list. These retries follow only a refused
#   or reset connection, each to the picker's next endpoint: as many as the requests.
MAX_REQUESTS = 65_536  # EnvoyConfig.max_requests' default
BODY_HEADROOM = 1024 * 1024  # bytes past max_body_bytes that a buffered body may reach us in


def buffered_body_bytes(max_body_bytes: int) -> int:
    """The largest body, bytes, that Envoy holds in BUFFERED mode (its listener's buffer limit)
    and so sends the picker in one ext_proc message (its gRPC receive limit): the picker's own
    ``max_body_bytes`` and ``BODY_HEADROOM`` more, so that its JSON 413 answers what is over.
    One number for both sides: a larger buffer than message limit was Envoy's 500."""
    return max_body_bytes + BODY_HEADROOM


_LIMITS = (
    "    circuit_breakers: {{thresholds: [{{max_connections: {n}, max_pending_requests: {n},"
    " max_requests: {n}, max_retries: {n}}}]}}\n"
)

_HOST = re.compile(r"[A-Za-z0-9._:-]+")  # a name, an IPv4 or an IPv6 address: no quote

_BOOTSTRAP = """\
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
static_resources:
  listeners:
  - name: inference
    address: {{socket_address: {{address: "{host}", port_value: {port}}}}}
{buffer_limit}    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {hcm}
          stat_prefix: inference{access_log}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: pool, timeout: {timeout_s}s{retry}}}
          http_filters:
{ext_proc}          - name: envoy.filters.http.router
            typed_config:
              "@type": {router}
  clusters:
{clusters}"""
_EXT_PROC = """\
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": {ext_proc}
              grpc_service:
                envoy_grpc: {{cluster_name: epp}}
                timeout: 10s
              failure_mode_allow: false
              message_timeout: 10s
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: {body_mode}
                response_body_mode: {body_mode}
                request_trailer_mode: SEND
                response_trailer_mode: SEND
{attributes}              metadata_options:
                forwarding_namespaces: {{untyped: ["envoy.lb.subset_hint", "envoy.lb"]}}
                receiving_namespaces: {{untyped: ["envoy.lb"]}}
"""
_ACCESS_LOG = """
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format:
                text_format_source:
                  inline_string: "{format}\\n\""""
_ATTRIBUTES = '              response_attributes: ["upstream.address"]\n'
_EPP_CLUSTER = """\
  - name: epp
    type: STATIC
    connect_timeout: 1s
{limits}    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
{assignment}"""
_ORIGINAL_DST = f"""\
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
{{limits}}{{http}}    original_dst_lb_config:
      use_http_header: true
      http_header_name: {DESTINATION_HEADER}
"""
_OVERRIDE_HOST = f"""\
  - name: pool
    type: STATIC
    connect_timeout: 1s
{{limits}}{{http}}    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": {_LB}override_host.v3.OverrideHost
            override_host_sources:
            - header: {DESTINATION_HEADER}
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": {_LB}round_robin.v3.RoundRobin
{{assignment}}"""
_ROUND_ROBIN = """\
  - name: pool
    type: STATIC
    lb_policy: ROUND_ROBIN
    connect_timeout: 1s
{limits}{http}{assignment}"""


@dataclass(frozen=True, slots=True)
class EnvoyConfig:
    """What the bootstrap says (module docstring). Addresses are ``host:port``, hosts as IPs."""

    pickers: Sequence[str]  # the pickers' gRPC addresses (empty: Envoy's own round robin)
    endpoints: Sequence[str] = ()  # the pool, listed: override_host (with pickers) or round robin
    listen: str = "0.0.0.0:8081"  # where Envoy takes the clients' requests
    admin_port: int = 9901  # Envoy's admin interface, on 127.0.0.1
    body_mode: str = "FULL_DUPLEX_STREAMED"  # ext_proc's request and response body modes
    # A request's route timeout, seconds; 0: none. It runs until the answer's last byte, and a
    # generation takes as long as it takes: at 120 s every longer stream was cut, with no
    # [DONE]. A silent one is still ended by Envoy's stream idle timeout (5 min).
    timeout_s: int = 0
    # The largest request body the picker takes (routing's max_body_bytes): in BUFFERED mode
    # Envoy holds the whole body, up to its listener's buffer limit (1 MiB by default, a plain
    # 413 from Envoy past it), so the limit is this and 1 MiB more: the picker's own JSON 413
    # answers what is over max_body_bytes, as serve does.
    max_body_bytes: int = 8 * 1024 * 1024
    access_log: str | None = None  # a file for one line a request (what was named, what served)
    trace: bool = False  # send the picker the endpoint that served (upstream.address)
    # Requests in flight through this Envoy at once: every cluster's circuit breakers (_LIMITS).
    max_requests: int = MAX_REQUESTS
    # Idle pooled connections to the replicas closed after this, seconds, before the engines'
    # own keep-alive timeout closes them (STALE_RETRY's note), as serve's pool; Envoy's is 1 h.
    upstream_idle_timeout_s: float = IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.upstream_idle_timeout_s > 0:
            raise ConfigError(
                f"upstream_idle_timeout_s must be positive, got {self.upstream_idle_timeout_s}"
            )
        if self.max_requests < 1:
            raise ConfigError(
                f"max_requests (--envoy-max-requests) must be at least 1, got {self.max_requests}"
            )
        if not 0 <= self.admin_port < 65536:
            raise ConfigError(
                f"admin_port (--envoy-admin-port) must be 0-65535, got {self.admin_port}"
            )
        if self.body_mode not in BODY_MODES:
            raise ConfigError(f"body mode {self.body_mode!r}: one of {', '.join(BODY_MODES)}")
        if not self.pickers and not self.endpoints:
            raise ConfigError("an Envoy config needs pickers or, without them, endpoints")
        for address in (*self.pickers, *self.endpoints, self.listen):
            _split(address)


def envoy_bootstrap(config: EnvoyConfig) -> str:
    """The Envoy bootstrap (YAML) for ``config``: ``envoy -c FILE`` runs it."""
    host, port = _split(config.listen)
    listed = _assignment("pool", config.endpoints) if config.endpoints else ""
    limits = _LIMITS.format(n=config.max_requests)
    http = _POOL_HTTP.format(idle=f"{config.upstream_idle_timeout_s:g}s")
    if not config.pickers:
        clusters = _ROUND_ROBIN.format(assignment=listed, limits=limits, http=http)
    elif config.endpoints:
        clusters = _OVERRIDE_HOST.format(assignment=listed, limits=limits, http=http)
    else:
        clusters = _ORIGINAL_DST.format(limits=limits, http=http)
    ext_proc = ""
    if config.pickers:
        clusters += _EPP_CLUSTER.format(
            assignment=_assignment("epp", config.pickers), limits=limits
        )
        ext_proc = _EXT_PROC.format(
            ext_proc=EXT_PROC,
            body_mode=config.body_mode,
            attributes=_ATTRIBUTES if config.trace else "",
        )
    log = config.access_log
    return _BOOTSTRAP.format(
        admin_port=config.admin_port,
        host=host,
        port=port,
        hcm=HCM,
        access_log=_ACCESS_LOG.format(path=log, format=ACCESS_FORMAT) if log else "",
        timeout_s=config.timeout_s,
        buffer_limit=(
            f"    per_connection_buffer_limit_bytes: {buffered_body_bytes(config.max_body_bytes)}\n"
            if config.pickers and config.body_mode == "BUFFERED" else ""
        ),
        retry=RETRY if config.pickers and config.endpoints else STALE_RETRY,
        ext_proc=ext_proc,
        router=ROUTER,
        clusters=clusters.rstrip("\n"),
    )


def _assignment(cluster: str, addresses: Sequence[str]) -> str:
    lines = [f"    load_assignment:\n      cluster_name: {cluster}\n      endpoints:\n"]
    lines.append("      - lb_endpoints:\n")
    for address in addresses:
        host, port = _split(address)
        lines.append(
            "        - endpoint:\n"
            f'            address: {{socket_address: {{address: "{host}", port_value: {port}}}}}\n'
        )
    return "".join(lines)


def _split(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port``; the host goes into the YAML quoted (a bare ``::`` was
    no YAML: Envoy refused the file that exited 0), so it may hold no quote."""
    host, _, port = address.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if host.startswith("[") != host.endswith("]") or (":" in host and not bracketed):
        raise ConfigError(f"address {address!r}: expected host:port or [v6 address]:port")
    host = host[1:-1] if bracketed else host
    if not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {address!r}: expected host:port")
    return host, int(port)
