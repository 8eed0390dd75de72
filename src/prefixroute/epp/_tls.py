"""TLS on the picker's ext_proc port (``--secure-serving``), as the reference picker serves it.

The Inference Extension's picker serves ext_proc over TLS unless told not to, from
``--cert-path`` (a folder holding ``tls.crt`` and ``tls.key``) or, without it, a self-signed
certificate made at start; the gateways in front of it are configured to skip verifying that
one. ``prefixroute epp`` serves plaintext by default (its own Envoy configurations and
manifests speak plaintext to it) and takes the same two flags for a gateway that speaks TLS.

``--enable-cert-reload`` (the reference's flag, which KServe passes so that it need not restart
the picker when cert-manager renews its certificate) reads ``--cert-path`` again when either
file changes. gRPC asks :class:`ReloadingCertificate` before each new connection's handshake,
which is when Go's ``GetCertificate`` is asked too: Envoy's open HTTP/2 connections keep the
certificate they were made with, new ones get the renewed one. A pair that does not load (half
written, or a key that is not the certificate's) is named in one warning and the previous pair
stays in service; a Secret volume swaps both files at once, so a renewal never shows one.

The self-signed certificate, and the check that a key belongs to its certificate, need the
``cryptography`` package (in the ``kubernetes`` extra, which the image installs); without it,
``--cert-path`` is required and only the PEM framing is checked. Health
(``grpc_health_port``) stays plaintext: the kubelet's gRPC probes do not speak TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import threading
from pathlib import Path

import grpc

from prefixroute.core import ConfigError

log = logging.getLogger(__name__)

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"  # the names the reference picker reads
VALID_DAYS = 3650  # a self-signed certificate nobody verifies: as long as the reference's


def server_credentials(cert_path: str | None, reload: bool = False) -> grpc.ServerCredentials:
    """The ext_proc port's TLS: ``cert_path``'s ``tls.crt`` and ``tls.key``, read again when
    they change if ``reload``, or a self-signed certificate when ``cert_path`` is None."""
    if cert_path is None:
        cert, key = self_signed()
        return grpc.ssl_server_credentials([(key, cert)])
    if reload:
        certificate = ReloadingCertificate(cert_path)
        # The stubs leave out the None that grpc's documentation gives as "no change".
        return grpc.dynamic_ssl_server_credentials(certificate.initial, certificate)  # type: ignore[arg-type]
    cert, key = read_pair(cert_path)
    return grpc.ssl_server_credentials([(key, cert)])


def read_pair(cert_path: str) -> tuple[bytes, bytes]:
    """(certificate chain, private key) from ``cert_path``, PEM, the key checked to be the
    certificate's where ``cryptography`` is installed; else a :class:`ConfigError`."""
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
    problem = _mismatch(cert, key)
    if problem:
        raise ConfigError(f"--cert-path {cert_path}: {problem}")
    return cert, key


def _mismatch(cert: bytes, key: bytes) -> str | None:
    """Why ``key`` cannot serve ``cert`` (the first certificate of the chain), or None; None
    too without ``cryptography``, where gRPC would only find out at a client's handshake."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        return None
    try:
        leaf = x509.load_pem_x509_certificate(cert)
    except ValueError:
        return f"{CERT_FILE} holds no certificate"
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):  # TypeError: an encrypted key, which needs a password
        return f"{KEY_FILE} holds no unencrypted private key"
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if leaf.public_key().public_bytes(*spki) != private.public_key().public_bytes(*spki):
        return f"{KEY_FILE} is not the key of the certificate in {CERT_FILE}"
    return None


class ReloadingCertificate:
    """``--cert-path``'s pair, read again when either file changes (module docstring).

    Called by gRPC, from its own threads, before each new connection's handshake: a changed
    pair is returned once, then None (keep the one in service) until the files change again.
    The check is two ``stat`` calls, which follow the Secret volume's symbolic links, so the
    swap of its ``..data`` link counts as a change."""

    def __init__(self, cert_path: str) -> None:
        self.cert_path = cert_path
        self._lock = threading.Lock()
        self._seen = self._stamp()
        cert, key = read_pair(cert_path)  # a bad pair at start is a ConfigError, as without
        self.initial = grpc.ssl_server_certificate_configuration([(key, cert)])

    def _stamp(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(Path(self.cert_path) / name) for name in (CERT_FILE, KEY_FILE)]
        except OSError:
            return None  # mid-swap or gone: keep the pair in service, look again next time
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._stamp()
        with self._lock:  # gRPC may ask from several threads at once; one of them reloads
            if stamp is None or stamp == self._seen:
                return None
            self._seen = stamp
            try:
                cert, key = read_pair(self.cert_path)
            except ConfigError as exc:
                log.warning("TLS certificate not reloaded, the previous one stays: %s", exc)
                return None
        log.info("TLS certificate reloaded from %s", self.cert_path)
        return grpc.ssl_server_certificate_configuration([(key, cert)])


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
