"""The reference picker's flags that ``prefixroute epp`` accepts and does not use.

The Inference Extension's chart (``config/charts/inferencepool``) starts its picker with
``--pool-name``, ``--zap-encoder json``, ``--log-level error`` and a plugins ``--config-file``,
plus any ``flags`` its values add; llm-d's charts add more (``--v``, ``--tracing``, ...). So that
our image runs under such a chart, those flags parse (``--flag``, ``--flag value`` or
``--flag=value``) and are named once in a warning at start: they configure parts of the reference
picker (its logger, its plugins, its metrics scraper) that ``prefixroute epp`` does its own way.
The flags it does honour (``--pool-name``, ``--pool-namespace``, ``--pool-group``,
``--grpc-port``, ``--grpc-health-port``, ``--metrics-port``, ``--secure-serving``,
``--cert-path``, ``--enable-cert-reload``, ``--ha-enable-leader-election``) are its own options.
"""

from __future__ import annotations

import argparse
import logging

# From the reference picker's cmd/epp/runner (flags) and controller-runtime's zap options.
IGNORED = (
    "zap-encoder", "zap-log-level", "zap-devel", "zap-stacktrace-level", "zap-time-encoding",
    "log-level", "v", "config-file", "config-text", "tracing", "enable-pprof", "health-checking",
    "refresh-metrics-interval", "refresh-prometheus-metrics-interval",
    "metrics-staleness-threshold", "total-queued-requests-metric",
    "kv-cache-usage-percentage-metric", "lora-info-metric", "model-server-metrics-port",
    "model-server-metrics-path", "model-server-metrics-scheme",
    "model-server-metrics-https-insecure-skip-verify", "metrics-endpoint-auth",
)  # fmt: skip


def go_bool(value: str) -> bool:
    """A boolean flag's value as Go's ``flag`` package reads one (``strconv.ParseBool``)."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r} (true or false)")


def add_reference_args(p: argparse.ArgumentParser) -> None:
    """The reference picker's serving flags that ``prefixroute epp`` honours, and the rest of
    its flags, accepted and ignored (module docstring)."""
    r = p.add_argument_group(
        "the reference picker's flags",
        "So that this picker runs under the Inference Extension's chart, it also takes the "
        "reference picker's --pool-name (above) and these; its other flags (--zap-encoder, "
        "--log-level, --v, --config-file, --tracing, ...) are accepted and ignored with a warning.",
    )
    r.add_argument(
        "--grpc-health-port",
        type=int,
        metavar="PORT",
        help="also answer gRPC health on this port, plaintext (the reference's 9003, which its "
        "chart probes; 0: any free port); default: on the gRPC port only",
    )
    r.add_argument(
        "--metrics-port",
        type=int,
        dest="http_port",
        default=argparse.SUPPRESS,
        help="the same as --http-port",
    )
    r.add_argument(
        "--secure-serving",
        nargs="?",
        const=True,
        default=False,
        type=go_bool,
        metavar="BOOL",
        help="TLS on the gRPC port, from --cert-path or a self-signed certificate (the "
        "reference's default; off here, where Envoy speaks plaintext to the picker)",
    )
    r.add_argument("--cert-path", metavar="DIR", help="with --secure-serving: tls.crt and tls.key")
    r.add_argument(
        "--enable-cert-reload",
        nargs="?",
        const=True,
        default=False,
        type=go_bool,
        metavar="BOOL",
        help="read --cert-path again when its files change, for connections made after (a "
        "renewed Secret is taken without a restart); default: read once at start",
    )
    add_ignored(p)


def _dest(flag: str) -> str:
    return "reference_" + flag.replace("-", "_")


def add_ignored(p: argparse.ArgumentParser) -> None:
    """Accept :data:`IGNORED`, hidden from ``--help`` (whose description names them)."""
    for flag in IGNORED:
        p.add_argument(
            f"--{flag}", dest=_dest(flag), nargs="?", const="", default=None, help=argparse.SUPPRESS
        )


def given(args: argparse.Namespace) -> list[str]:
    """The ignored flags this command line gave, as typed (``--zap-encoder=json``)."""
    out = []
    for flag in IGNORED:
        value = getattr(args, _dest(flag), None)
        if value is not None:
            out.append(f"--{flag}={value}" if value else f"--{flag}")
    return out


def warn_ignored(args: argparse.Namespace, log: logging.Logger) -> None:
    """One warning naming the ignored flags given, and one if ``--enable-cert-reload`` has
    nothing to reload (as in the reference, where it only concerns ``--cert-path``)."""
    if args.enable_cert_reload and not (args.secure_serving and args.cert_path):
        log.warning(
            "--enable-cert-reload has no effect: %s",
            "--cert-path is not given (the certificate is made at start)" if args.secure_serving
            else "the gRPC port serves plaintext (add --secure-serving and --cert-path)",
        )
    flags = given(args)
    if flags:
        log.warning(
            "ignoring the reference picker's %s: prefixroute epp routes by its own --policy and "
            "--config, logs and scrapes its own way (docs/kubernetes.md)", " ".join(flags)
        )
