"""Running under the reference picker's chart: its flags, its health port, its TLS.

From the spec (``commands/_epp_reference.py``, ``epp/_tls.py``, and the chart's
``epp-deployment.yaml``: ``--pool-name``, ``--zap-encoder json``, ``--log-level error``,
``--config-file``, gRPC health probed on 9003 as ``inference-extension``, TLS on the ext_proc port
unless ``--secure-serving=false``): the chart's arguments parse, the flags we do not use are
named once in a warning, health answers on its own plaintext port, and the ext_proc port speaks
TLS from ``--cert-path`` or a self-signed certificate.
"""

from __future__ import annotations

import argparse
import logging
import ssl
from pathlib import Path

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from prefixroute.core import ConfigError
from prefixroute.epp import EndpointPicker

from .conftest import PickerFactory

pytest.importorskip("cryptography")

# The chart's container arguments, as its template renders them with its default values.
CHART_ARGS = ["--pool-name", "vllm-pool", "--zap-encoder", "json", "--log-level", "error",
              "--config-file", "/config/default-plugins.yaml"]  # fmt: skip


def parse(*argv: str) -> argparse.Namespace:
    from prefixroute.commands.epp import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["epp", *argv])


def test_the_charts_arguments_parse_and_the_unused_ones_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prefixroute.commands._epp_reference import warn_ignored
    from prefixroute.commands.epp import config_from_args

    args = parse(*CHART_ARGS, "--v=2", "--tracing", "--grpc-port", "9002")
    config = config_from_args(args)
    assert args.pool_name == "vllm-pool" and config.grpc_port == 9002
    with caplog.at_level(logging.WARNING):
        warn_ignored(args, logging.getLogger("test"))
    (record,) = caplog.records
    for flag in ("--zap-encoder=json", "--log-level=error",
                 "--config-file=/config/default-plugins.yaml", "--v=2", "--tracing"):  # fmt: skip
        assert flag in record.getMessage()
    caplog.clear()
    warn_ignored(parse("--endpoint", "10.0.0.1:8000"), logging.getLogger("test"))
    assert caplog.records == []


def test_the_reference_serving_flags() -> None:
    from prefixroute.commands.epp import config_from_args

    base = ("--endpoint", "10.0.0.1:8000")
    assert config_from_args(parse(*base, "--metrics-port", "9191")).http_port == 9191
    assert config_from_args(parse(*base)).http_port == 9090
    config = config_from_args(parse(*base, "--grpc-health-port", "9003", "--secure-serving",
                                    "--cert-path", "/certs"))  # fmt: skip
    assert (config.grpc_health_port, config.secure_serving, config.cert_path) == (
        9003, True, "/certs",
    )  # fmt: skip
    assert not config_from_args(parse(*base, "--secure-serving=false")).secure_serving
    with pytest.raises(ConfigError, match="--cert-path is for --secure-serving"):
        config_from_args(parse(*base, "--cert-path", "/certs"))
    from prefixroute.commands.epp import envoy_config_of

    with pytest.raises(ConfigError, match="speaks plaintext to the picker"):
        envoy_config_of(config_from_args(parse(*base, "--secure-serving")), "0.0.0.0:8081")


async def check(port: int, service: str, credentials: grpc.ChannelCredentials | None = None,
                name: str | None = None) -> str:  # fmt: skip
    target = f"127.0.0.1:{port}"
    options = [("grpc.ssl_target_name_override", name)] if name else []
    channel = (grpc.aio.secure_channel(target, credentials, options) if credentials
               else grpc.aio.insecure_channel(target))  # fmt: skip
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


async def test_health_on_its_own_plaintext_port(make_picker: PickerFactory) -> None:
    epp: EndpointPicker = await make_picker(epp={"grpc_health_port": 0})
    assert epp.grpc_health_port not in (0, epp.grpc_port)
    for service in ("inference-extension", "liveness", "readiness", ""):
        assert await check(epp.grpc_health_port, service) == "SERVING"
    # Only health there: the picking stays on the gRPC port.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_health_port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_tls_from_cert_path(make_picker: PickerFactory, tmp_path: Path) -> None:
    from prefixroute.epp._tls import self_signed

    cert, key = self_signed(("picker.example",))
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    epp: EndpointPicker = await make_picker(
        epp={"secure_serving": True, "cert_path": str(tmp_path), "grpc_health_port": 0}
    )
    trusted = grpc.ssl_channel_credentials(root_certificates=cert)
    assert await check(epp.grpc_port, "", trusted, "picker.example") == "SERVING"
    with pytest.raises(grpc.aio.AioRpcError):  # plaintext to the TLS port
        await check(epp.grpc_port, "")
    assert await check(epp.grpc_health_port, "readiness") == "SERVING"  # probes: plaintext


async def test_a_self_signed_certificate_without_cert_path(make_picker: PickerFactory) -> None:
    epp: EndpointPicker = await make_picker(epp={"secure_serving": True})
    pem = ssl.get_server_certificate(("127.0.0.1", epp.grpc_port))
    assert "BEGIN CERTIFICATE" in pem
    trusted = grpc.ssl_channel_credentials(root_certificates=pem.encode())
    assert await check(epp.grpc_port, "", trusted, "localhost") == "SERVING"


def test_unreadable_or_not_pem_certificates_are_one_line(tmp_path: Path) -> None:
    from prefixroute.epp._tls import server_credentials

    with pytest.raises(ConfigError, match="cannot read tls.crt and tls.key"):
        server_credentials(str(tmp_path))
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ConfigError, match="must be PEM"):
        server_credentials(str(tmp_path))


async def test_a_picker_started_as_the_chart_starts_it(tmp_path: Path) -> None:
    """``prefixroute epp`` with the chart's arguments (and the two flags its values must add for
    this picker: the health port it probes, and TLS), against a fake API holding the pool and
    one pod that serves two emulated engines, one per target port."""
    import asyncio
    import os
    import subprocess

    import aiohttp
    from polling import until

    from prefixroute.emulate import EmulatorConfig, start_replicas

    from .envoy import free_port
    from .lease_api import LeaseAPI
    from .test_leader import _prefixroute

    cluster = await start_replicas(2, EmulatorConfig())
    try:
        ports = [int(u.rsplit(":", 1)[1]) for u in cluster.urls]
        with LeaseAPI() as api:
            api.pools[("team", "vllm-pool")] = {
                "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                "metadata": {"name": "vllm-pool", "namespace": "team"},
                "spec": {"selector": {"matchLabels": {"app": "vllm"}},
                         "targetPorts": [{"number": p} for p in ports]},
            }  # fmt: skip
            api.pods.append({
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": "vllm-0", "namespace": "team", "labels": {"app": "vllm"}},
                "status": {"podIP": "127.0.0.1",
                           "conditions": [{"type": "Ready", "status": "True"}]},
            })  # fmt: skip
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(api.kubeconfig())
            grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
            argv = [_prefixroute(), "epp", *CHART_ARGS, "--grpc-port", str(grpc_port),
                    "--metrics-port", str(metrics_port), "--grpc-health-port", str(health_port),
                    "--secure-serving", "true"]  # fmt: skip
            env = dict(os.environ, KUBECONFIG=str(kubeconfig), NAMESPACE="team")
            log = tmp_path / "epp.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                async with aiohttp.ClientSession() as session:

                    async def both_endpoints_healthy() -> bool:
                        try:
                            url = f"http://127.0.0.1:{metrics_port}/health"
                            async with session.get(url) as resp:
                                return (await resp.json())["healthy_endpoints"] == 2
                        except aiohttp.ClientError:
                            return False

                    await until(both_endpoints_healthy, timeout_s=60, every_s=0.2)
                assert await check(health_port, "inference-extension") == "SERVING"
                pem = await asyncio.to_thread(
                    ssl.get_server_certificate, ("127.0.0.1", grpc_port)
                )
                trusted = grpc.ssl_channel_credentials(root_certificates=pem.encode())
                assert await check(grpc_port, "readiness", trusted, "localhost") == "SERVING"
            finally:
                proc.terminate()
                assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        await cluster.stop()
    text = log.read_text()
    assert "ignoring the reference picker's --zap-encoder=json --log-level=error " \
        "--config-file=/config/default-plugins.yaml" in text
    assert "Traceback" not in text
