"""The gateway's list settings that carry a spec per replica, parsed (``--kv-events``,
``--replica-speed``): each raises :class:`ConfigError` with the flag's expected form."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from prefixroute.core import SPEED_PRIOR_KEYS, ConfigError, SpeedPrior
from prefixroute.events import EventEndpoint


def check_otlp_endpoint(url: str | None) -> None:
    """``otlp_endpoint``, where set, must be ``http(s)://HOST:PORT``. The exporter takes
    anything and fails in its own thread once spans flow: a typo lost every trace unsaid."""
    if url is None:
        return
    form = f"otlp_endpoint must be http(s)://HOST:PORT, not {url!r}"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a port out of range or not a number
    except ValueError as exc:
        raise ConfigError(f"{form} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or " " in parts.netloc:
        raise ConfigError(form)
    if not port:  # none: the exporter dialled gRPC's default, 443, not the collector's 4317
        raise ConfigError(f"{form} ({'port 0' if port == 0 else 'no port'})")


def parse_kv_events(items: Iterable[str]) -> dict[str, EventEndpoint]:
    """``URL=bind|connect:ADDR`` items: replica URL (as written) -> endpoint."""
    out: dict[str, EventEndpoint] = {}
    for item in items:
        url, sep, spec = item.partition("=")
        if not sep or not url.strip():
            raise ConfigError(f"--kv-events takes REPLICA_URL=bind|connect:ADDR, got {item!r}")
        if url.strip() in out:
            raise ConfigError(f"two KV-event streams for replica {url.strip()}")
        out[url.strip()] = EventEndpoint.parse(spec)
    return out


def parse_replica_speeds(items: Iterable[str]) -> dict[str, SpeedPrior]:
    """``URL=prefill_tokens_per_s=N[,decode_step_s=S][,max_running=M]`` items: replica URL
    (as written) -> its priors."""
    out: dict[str, SpeedPrior] = {}
    for item in items:
        url, _, spec = (part.strip() for part in item.partition("="))
        values: dict[str, float] = {}
        for pair in spec.split(","):
            key, sep, value = (part.strip() for part in pair.partition("="))
            if not sep or key not in SPEED_PRIOR_KEYS:
                raise ConfigError(
                    "--replica-speed takes URL=prefill_tokens_per_s=N[,decode_step_s=S]"
                    f"[,max_running=M], got {item!r}"
                )
            try:
                values[key] = float(value)
            except ValueError:
                why = f"--replica-speed: {key} must be a number, got {value!r}"
                raise ConfigError(why) from None
        if not url or url in out:
            raise ConfigError(f"--replica-speed: one entry per replica URL, got {item!r}")
        out[url] = SpeedPrior.from_mapping(values)
    return out
