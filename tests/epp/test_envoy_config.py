"""The Envoy bootstrap the picker ships (``prefixroute.epp.envoy_bootstrap``,
``prefixroute epp --print-envoy-config``), read back as YAML and checked against what its
docstring and docs/kubernetes.md say it sets. Every Envoy test of ``make test-epp`` runs on it;
``test_a_real_envoy_accepts_every_variant`` has Envoy itself validate each form."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefixroute.cli import main
from prefixroute.core import ConfigError
from prefixroute.epp import DESTINATION_HEADER, EnvoyConfig, envoy_bootstrap

PICKER = "127.0.0.1:9002"
POOL = ("10.0.0.7:8000", "10.0.0.8:8001")


def load(config: EnvoyConfig) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(envoy_bootstrap(config))
    return doc


def hcm(doc: dict[str, Any]) -> dict[str, Any]:
    listener = doc["static_resources"]["listeners"][0]
    typed: dict[str, Any] = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return typed


def clusters(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["static_resources"]["clusters"]}


def addresses(cluster: dict[str, Any]) -> list[str]:
    lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    return [
        f"{e['endpoint']['address']['socket_address']['address']}:"
        f"{e['endpoint']['address']['socket_address']['port_value']}"
        for e in lb
    ]


def test_the_picker_s_filter_fails_closed_and_streams_both_bodies() -> None:
    doc = load(EnvoyConfig(pickers=[PICKER], listen="127.0.0.1:18081", admin_port=19901))
    listener = doc["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 18081}
    assert doc["admin"]["address"]["socket_address"]["port_value"] == 19901
    filters = hcm(doc)["http_filters"]
    assert [f["name"] for f in filters] == [
        "envoy.filters.http.ext_proc", "envoy.filters.http.router",
    ]  # fmt: skip
    ext = filters[0]["typed_config"]
    assert ext["failure_mode_allow"] is False
    assert ext["grpc_service"]["envoy_grpc"]["cluster_name"] == "epp"
    mode = ext["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["request_header_mode"] == mode["response_trailer_mode"] == "SEND"
    assert ext["metadata_options"]["receiving_namespaces"]["untyped"] == ["envoy.lb"]
    assert "envoy.lb.subset_hint" in ext["metadata_options"]["forwarding_namespaces"]["untyped"]
    assert "response_attributes" not in ext
    by_name = clusters(doc)
    assert addresses(by_name["epp"]) == [PICKER]
    assert "http2_protocol_options" in str(by_name["epp"]["typed_extension_protocol_options"])
    # No pool listed: ORIGINAL_DST follows the picker's one endpoint; a request reset before
    # its answer (a pooled connection the replica closed) goes there once more.
    pool = by_name["pool"]
    assert pool["type"] == "ORIGINAL_DST" and pool["lb_policy"] == "CLUSTER_PROVIDED"
    assert pool["original_dst_lb_config"]["http_header_name"] == DESTINATION_HEADER
    route = hcm(doc)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    # No route timeout: it would cut a stream that runs longer (a long generation).
    assert route == {"cluster": "pool", "timeout": "0s",
                     "retry_policy": {"retry_on": "reset", "num_retries": 1}}  # fmt: skip
    assert "access_log" not in hcm(doc)


def test_a_listed_pool_is_override_host_with_retries_down_the_list() -> None:
    doc = load(EnvoyConfig(pickers=[PICKER, "127.0.0.1:9003"], endpoints=POOL))
    by_name = clusters(doc)
    pool = by_name["pool"]
    assert addresses(pool) == list(POOL)
    policy = pool["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    assert policy["typed_config"]["override_host_sources"] == [{"header": DESTINATION_HEADER}]
    assert "fallback_policy" in policy["typed_config"]
    assert addresses(by_name["epp"]) == [PICKER, "127.0.0.1:9003"]
    route = hcm(doc)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["retry_policy"] == {"retry_on": "connect-failure,reset", "num_retries": 3}


def test_without_a_picker_it_is_envoy_s_own_round_robin() -> None:
    doc = load(EnvoyConfig(pickers=(), endpoints=POOL))
    assert [f["name"] for f in hcm(doc)["http_filters"]] == ["envoy.filters.http.router"]
    by_name = clusters(doc)
    assert set(by_name) == {"pool"}
    assert by_name["pool"]["lb_policy"] == "ROUND_ROBIN"
    assert addresses(by_name["pool"]) == list(POOL)
    route = hcm(doc)["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["retry_policy"] == {"retry_on": "reset", "num_retries": 1}


def test_trace_sends_the_served_endpoint_and_logs_each_request(tmp_path: Path) -> None:
    log = tmp_path / "access.log"
    doc = load(EnvoyConfig(pickers=[PICKER], body_mode="BUFFERED", access_log=str(log),
                           trace=True))  # fmt: skip
    ext = hcm(doc)["http_filters"][0]["typed_config"]
    assert ext["response_attributes"] == ["upstream.address"]
    assert ext["processing_mode"]["request_body_mode"] == "BUFFERED"
    access = hcm(doc)["access_log"][0]["typed_config"]
    assert access["path"] == str(log)
    line = access["log_format"]["text_format_source"]["inline_string"]
    assert line.startswith(f"%REQ({DESTINATION_HEADER})% %UPSTREAM_HOST%") and line.endswith("\n")


# The pool's three forms: ORIGINAL_DST after a picker, override_host after one, no picker.
VARIANTS: list[dict[str, Any]] = [
    {"pickers": [PICKER]},
    {"pickers": [PICKER], "endpoints": POOL},
    {"pickers": (), "endpoints": POOL},
]
VARIANT_IDS = ["original-dst", "override-host", "round-robin"]


def limits(cluster: dict[str, Any]) -> dict[str, Any]:
    thresholds: list[dict[str, Any]] = cluster["circuit_breakers"]["thresholds"]
    assert len(thresholds) == 1 and "priority" not in thresholds[0]  # the default priority
    return thresholds[0]


@pytest.mark.parametrize("max_requests", [None, 300])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_every_cluster_takes_max_requests_in_flight(
    variant: dict[str, Any], max_requests: int | None
) -> None:
    """Envoy's circuit breakers default to 1,024 connections, pending and parallel requests and
    3 retries per cluster, which is fewer than a fleet has generations in flight (each holds a
    picker stream and a pool connection) or a crash has requests to rescue. The docstring's
    figure is 65,536 for all four, on the picker's cluster and the pool alike."""
    given = {} if max_requests is None else {"max_requests": max_requests}
    config = EnvoyConfig(**variant, **given)
    n = 65_536 if max_requests is None else max_requests
    by_name = clusters(load(config))
    assert set(by_name) == ({"pool", "epp"} if variant["pickers"] else {"pool"})
    for cluster in by_name.values():
        assert limits(cluster) == {
            "max_connections": n, "max_pending_requests": n, "max_requests": n, "max_retries": n,
        }  # fmt: skip


def pool_http(cluster: dict[str, Any]) -> dict[str, Any]:
    options = cluster["typed_extension_protocol_options"]
    http: dict[str, Any] = options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    return http


@pytest.mark.parametrize("idle", [None, 0.5])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_the_pool_closes_idle_connections_before_the_engines_do(
    variant: dict[str, Any], idle: float | None
) -> None:
    """vLLM's and SGLang's servers close a connection idle for 5 s; Envoy's default keeps one
    for an hour. The pool's default is 4 s (docstring), over HTTP/1.1; the picker's cluster
    stays HTTP/2 with Envoy's own idle timeout."""
    given = {} if idle is None else {"upstream_idle_timeout_s": idle}
    by_name = clusters(load(EnvoyConfig(**variant, **given)))
    http = pool_http(by_name["pool"])
    assert http["common_http_protocol_options"] == {"idle_timeout": "4s" if idle is None
                                                    else "0.5s"}  # fmt: skip
    assert http["explicit_http_config"] == {"http_protocol_options": {}}
    if "epp" in by_name:
        assert "common_http_protocol_options" not in pool_http(by_name["epp"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pickers": ()},  # nothing to send requests to
        {"pickers": [PICKER], "upstream_idle_timeout_s": 0},
        {"pickers": [PICKER], "max_requests": 0},
        {"pickers": [PICKER], "body_mode": "STREAMED"},
        {"pickers": ["127.0.0.1"]},
        {"pickers": [PICKER], "endpoints": ["10.0.0.7:99999"]},
        {"pickers": [PICKER], "listen": "8081"},
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        EnvoyConfig(**kwargs)


def test_the_command_prints_it_for_the_picker_s_own_settings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["epp", "--endpoint", POOL[0], "--endpoint", POOL[1], "--grpc-port", "9100"]
    assert main([*argv, "--print-envoy-config", "--envoy-listen", "127.0.0.1:8090"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert addresses(clusters(doc)["epp"]) == ["127.0.0.1:9100"]
    assert clusters(doc)["pool"]["type"] == "ORIGINAL_DST"  # one endpoint named: no list
    listen = doc["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listen == {"address": "127.0.0.1", "port_value": 8090}
    # --fallbacks: the endpoints become the override_host pool; --buffered: BUFFERED bodies.
    assert main([*argv, "--fallbacks", "1", "--buffered", "--print-envoy-config"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert addresses(clusters(doc)["pool"]) == list(POOL)
    ext = hcm(doc)["http_filters"][0]["typed_config"]
    assert ext["processing_mode"]["response_body_mode"] == "BUFFERED"
    # --envoy-max-requests: every cluster's circuit breakers; below 1, one line and exit 2.
    assert main([*argv, "--print-envoy-config", "--envoy-max-requests", "5000"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert {limits(c)["max_requests"] for c in clusters(doc).values()} == {5000}
    assert main([*argv, "--print-envoy-config", "--envoy-max-requests", "0"]) == 2
    assert "--envoy-max-requests" in capsys.readouterr().err
    # --envoy-admin-port: Envoy's admin interface moves (two Envoys on one host collided at
    # 9901); out of range, one line and exit 2.
    assert doc["admin"]["address"]["socket_address"]["port_value"] == 9901
    assert main([*argv, "--print-envoy-config", "--envoy-admin-port", "0"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 0}
    assert main([*argv, "--print-envoy-config", "--envoy-admin-port", "70000"]) == 2
    assert "--envoy-admin-port" in capsys.readouterr().err
    # The pool's idle timeout is the routing setting serve's pool takes (--config).
    config = tmp_path / "gateway.toml"
    config.write_text("upstream_idle_timeout_s = 2.5\n")
    assert main([*argv, "--print-envoy-config", "--config", str(config)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    pool = pool_http(clusters(doc)["pool"])
    assert pool["common_http_protocol_options"]["idle_timeout"] == "2.5s"
    # A listener address that is not HOST:PORT: one line, exit 2.
    assert main([*argv, "--print-envoy-config", "--envoy-listen", "nowhere"]) == 2
    assert capsys.readouterr().err.startswith("prefixroute: error: address 'nowhere'")


@pytest.mark.envoy
@pytest.mark.parametrize(
    "config",
    [
        EnvoyConfig(pickers=[PICKER]),
        EnvoyConfig(pickers=[PICKER], endpoints=POOL, body_mode="BUFFERED"),
        EnvoyConfig(pickers=(), endpoints=POOL),
        EnvoyConfig(pickers=[PICKER], access_log="/tmp/prefixroute-envoy.log", trace=True),
    ],
    ids=["original-dst", "override-host", "round-robin", "trace"],
)
def test_a_real_envoy_accepts_every_variant(
    envoy_path: str, config: EnvoyConfig, tmp_path: Path
) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(envoy_bootstrap(config))
    done = subprocess.run(
        [envoy_path, "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_ipv6_addresses_are_yaml_and_a_broken_one_is_refused() -> None:
    # A bare "::" was no YAML: the command exited 0 and Envoy refused the file (the CLI audit
    # of 2026-12-07); "[::1:8081" was taken.
    doc = load(EnvoyConfig(pickers=["[::1]:9002"], listen="[::]:8081"))
    listener = doc["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert (listener["address"], listener["port_value"]) == ("::", 8081)
    assert addresses(clusters(doc)["epp"]) == ["::1:9002"]
    for bad in ("[::1:8081", "::1:8081", 'a"b:80'):
        with pytest.raises(ConfigError, match="expected host:port"):
            EnvoyConfig(pickers=[PICKER], listen=bad)
