"""TLS on the picker's ext_proc port (``--secure-serving``), as the reference picker serves it.

The Inference Extension's picker serves ext_proc over TLS unless told not to, from
``--cert-path`` (a folder holding ``tls.crt`` and ``tls.key``) or, without it, a self-signed
certificate made at start; the gateways in front of it are configured to skip verifying that
one. ``prefixroute epp`` serves plaintext by default (its own Envoy configurations and
manifests speak plaintext to it) and takes the same two flags for a gateway that speaks TLS.

The self-signed certificate needs the ``cryptography`` package (in the ``kubernetes`` extra,
which the image installs); without it, ``--cert-path`` is required. Health (``grpc_health_port``)
stays plaintext: the kubelet's gRPC probes do not speak TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from pathlib import Path

import grpc

from prefixroute.core import ConfigError

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"  # the names the reference picker reads
VALID_DAYS = 3650  # a self-signed certificate nobody verifies: as long as the reference's


def server_credentials(cert_path: str | None) -> grpc.ServerCredentials:
    """The ext_proc port's TLS: ``cert_path``'s ``tls.crt`` and ``tls.key``, or a self-signed
    certificate when it is None."""
    if cert_path is None:
        cert, key = self_signed()
    else:
        folder = Path(cert_path)
        try:
            cert, key = (folder / CERT_FILE).read_bytes(), (folder / KEY_FILE).read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"--cert-path {cert_path}: cannot read {CERT_FILE} and {KEY_FILE} there "
                f"({exc.strerror or exc})"
            ) from exc
        if b"-----BEGIN" not in cert or b"-----BEGIN" not in key:
            raise ConfigError(f"--cert-path {cert_path}: {CERT_FILE} and {KEY_FILE} must be PEM")
    return grpc.ssl_server_credentials([(key, cert)])


def self_signed(hosts: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """(certificate, private key), PEM, self-signed for this host (its name, ``localhost`` and
    the loopback addresses, and ``hosts``)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:
        raise ConfigError(
            "--secure-serving without --cert-path makes a self-signed certificate, which needs "
            "the cryptography package: pip install 'prefixroute[kubernetes]', or give --cert-path"
        ) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prefixroute-epp")])
    dns = [socket.gethostname(), "localhost", *hosts]
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns)]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
