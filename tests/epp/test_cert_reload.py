"""``--enable-cert-reload``: a renewed certificate taken without a restart.

From the spec (``epp/_tls.py``'s docstring, the reference picker's flag of the same name, and
KServe, which passes it so as not to restart the picker on renewal): with the flag, a connection
made after ``--cert-path``'s files change gets the new certificate; a changed pair that does not
load leaves the previous one in service, with one warning; without the flag the pair read at
start stays. The folder is laid out as a Kubernetes Secret volume is (``tls.crt`` and
``tls.key`` are links into ``..data``, itself a link swapped to a new folder on each update).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

import pytest

from prefixroute.core import ConfigError
from prefixroute.epp import EndpointPicker

from .conftest import PickerFactory
from .test_reference_flags import parse

pytest.importorskip("cryptography")

from prefixroute.epp._tls import self_signed  # noqa: E402 (after the skip: needs cryptography)


class SecretVolume:
    """A folder written as the kubelet writes a Secret volume: atomically, by a link swap."""

    def __init__(self, root: Path) -> None:
        self.root, self.version = root, 0
        for name in ("tls.crt", "tls.key"):
            (root / name).symlink_to(Path("..data") / name)

    def write(self, cert: bytes, key: bytes) -> None:
        self.version += 1
        stamped = self.root / f"..2026_12_04_00_00_{self.version:02d}"
        stamped.mkdir()
        (stamped / "tls.crt").write_bytes(cert)
        (stamped / "tls.key").write_bytes(key)
        (self.root / "..data_tmp").symlink_to(stamped.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")  # the atomic step


async def served(port: int) -> bytes:
    """The certificate a new TLS connection to ``port`` is given, DER."""
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return ssl.PEM_cert_to_DER_cert(pem)


def der(cert: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.decode())


async def test_a_renewed_secret_is_served_to_new_connections(
    make_picker: PickerFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path)
    first, second, third = (self_signed((f"{n}.example",)) for n in ("first", "second", "third"))
    volume.write(*first)
    epp: EndpointPicker = await make_picker(
        epp={"secure_serving": True, "cert_path": str(tmp_path), "cert_reload": True}
    )
    assert await served(epp.grpc_port) == der(first[0])
    volume.write(*second)
    assert await served(epp.grpc_port) == der(second[0])
    assert await served(epp.grpc_port) == der(second[0])

    # A pair whose key is another certificate's: the renewed one stays, one warning.
    with caplog.at_level(logging.WARNING, logger="prefixroute.epp"):
        volume.write(third[0], first[1])
        assert await served(epp.grpc_port) == der(second[0])
        assert await served(epp.grpc_port) == der(second[0])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "is not the key of the certificate" in warnings[0]
    assert "Traceback" not in caplog.text

    volume.write(*third)  # the pair completed
    assert await served(epp.grpc_port) == der(third[0])


async def test_without_the_flag_the_pair_read_at_start_stays(
    make_picker: PickerFactory, tmp_path: Path
) -> None:
    volume = SecretVolume(tmp_path)
    first, second = self_signed(("first.example",)), self_signed(("second.example",))
    volume.write(*first)
    epp: EndpointPicker = await make_picker(
        epp={"secure_serving": True, "cert_path": str(tmp_path)}
    )
    volume.write(*second)
    assert await served(epp.grpc_port) == der(first[0])


def test_a_key_that_is_not_the_certificates_is_one_line_at_start(tmp_path: Path) -> None:
    from prefixroute.epp._tls import server_credentials

    mine, other = self_signed(), self_signed()
    (tmp_path / "tls.crt").write_bytes(mine[0])
    (tmp_path / "tls.key").write_bytes(other[1])
    for reload in (False, True):
        with pytest.raises(ConfigError, match="tls.key is not the key of the certificate"):
            server_credentials(str(tmp_path), reload)
    (tmp_path / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n")
    with pytest.raises(ConfigError, match="tls.key holds no unencrypted private key"):
        server_credentials(str(tmp_path), True)


def test_the_flag_parses_as_go_reads_it_and_says_when_it_does_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prefixroute.commands._epp_reference import warn_ignored
    from prefixroute.commands.epp import config_from_args

    base = ("--endpoint", "10.0.0.1:8000")
    on = ("--secure-serving", "--cert-path", "/certs")
    assert config_from_args(parse(*base, *on, "--enable-cert-reload")).cert_reload
    assert config_from_args(parse(*base, *on, "--enable-cert-reload=true")).cert_reload
    assert not config_from_args(parse(*base, *on, "--enable-cert-reload=false")).cert_reload
    assert not config_from_args(parse(*base, *on)).cert_reload
    with pytest.raises(SystemExit):
        parse(*base, "--enable-cert-reload=maybe")

    logger = logging.getLogger("test")
    with caplog.at_level(logging.WARNING):
        warn_ignored(parse(*base, *on, "--enable-cert-reload"), logger)
        assert caplog.records == []
        # KServe's picker arguments: the flag without --cert-path (nor TLS, here).
        warn_ignored(parse(*base, "--enable-cert-reload"), logger)
        warn_ignored(parse(*base, "--secure-serving", "--enable-cert-reload"), logger)
    first, second = (r.getMessage() for r in caplog.records)
    assert "no effect" in first and "plaintext" in first
    assert "no effect" in second and "--cert-path is not given" in second
