"""The gateway's settings and the TOML file they can come from (format in ``CONFIG_HELP``)."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixroute.core import DEFAULT_POLICY, ConfigError, make_policy

CONFIG_HELP = """\
config file (--config FILE, TOML): every GatewayConfig field by name, the replica list and
the policy's parameters. Flags given on the command line override the file.

    # gateway.toml -- prefixroute serve --config gateway.toml
    host = "0.0.0.0"
    port = 8000
    policy = "predicted_ttft"          # any name from `prefixroute simulate --help`
    admin_token = "change-me"          # or --admin-token / $PREFIXROUTE_ADMIN_TOKEN
    block_chars = 64                   # characters per routing block
    read_timeout_s = 300.0

    [policy_params]                    # fields of the policy's config dataclass
    prefill_tokens_per_s = 12000.0

    [[replicas]]
    url = "http://10.0.0.11:8000"

    [[replicas]]
    url = "http://10.0.0.12:8000"

Other fields: max_body_bytes, max_in_flight, max_in_flight_per_replica, retry_after_s,
connect_timeout_s, health_interval_s, health_timeout_s, scrape_metrics, failure_threshold,
eject_s, shutdown_timeout_s, index_capacity_blocks, kv_block_size, seed.
"""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"  # address to bind
    port: int = 8000  # port to bind; 0 picks a free one
    replicas: tuple[str, ...] = ()  # replica base URLs at start
    policy: str = DEFAULT_POLICY  # routing policy, by registry name
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # policy config overrides
    admin_token: str | None = None  # bearer token of /admin/*; None disables the admin API
    block_chars: int = 64  # characters (or token ids) per routing block
    index_capacity_blocks: int | None = 16384  # prefix-index entries per replica, blocks
    kv_block_size: int = 16  # replicas' tokens per KV block, for the load view
    max_body_bytes: int = 8 * 1024 * 1024  # largest request body accepted, bytes (else 413)
    max_in_flight: int = 4096  # requests the gateway handles at once (else 429)
    max_in_flight_per_replica: int = 512  # requests in flight per replica (all full: 503)
    retry_after_s: int = 1  # Retry-After on 429/503, seconds
    connect_timeout_s: float = 5.0  # upstream connect timeout, seconds
    read_timeout_s: float = 300.0  # longest silence from an upstream, seconds (504 if first)
    health_interval_s: float = 2.0  # active /health probe period, seconds
    health_timeout_s: float = 1.0  # one probe's timeout, seconds
    scrape_metrics: bool = True  # read the replicas' own load from their /metrics each round
    failure_threshold: int = 3  # consecutive failures that take a replica out
    eject_s: float = 5.0  # shortest time out after failures, seconds
    shutdown_timeout_s: float = 30.0  # graceful shutdown: in-flight requests may finish, s
    seed: int = 0  # router randomness (tie breaks)

    def __post_init__(self) -> None:
        positive = {
            "block_chars": self.block_chars,
            "kv_block_size": self.kv_block_size,
            "max_body_bytes": self.max_body_bytes,
            "max_in_flight": self.max_in_flight,
            "max_in_flight_per_replica": self.max_in_flight_per_replica,
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "failure_threshold": self.failure_threshold,
        }
        bad = [name for name, value in positive.items() if value <= 0]
        if bad:
            raise ConfigError(f"gateway settings must be positive: {', '.join(bad)}")
        if self.index_capacity_blocks is not None and self.index_capacity_blocks < 1:
            raise ConfigError("index_capacity_blocks must be positive (or unset for unbounded)")
        if min(self.eject_s, self.shutdown_timeout_s, self.retry_after_s) < 0:
            raise ConfigError("eject_s, shutdown_timeout_s and retry_after_s must not be negative")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port out of range: {self.port}")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ConfigError("the admin token must be at least 8 characters")
        make_policy(self.policy, **self.policy_params)  # unknown names fail here, at start


_FIELDS = {f.name for f in dataclasses.fields(GatewayConfig)}


def load_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file, as keyword arguments of :class:`GatewayConfig`."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "replicas":
            out["replicas"] = tuple(_replica_url(path, item) for item in value)
        elif key in _FIELDS:
            out[key] = value
        else:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
    return out


def _replica_url(path: str | Path, item: object) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping) and isinstance(item.get("url"), str):
        return str(item["url"])
    raise ConfigError(f"config file {path}: each [[replicas]] entry needs a url")


def build_config(file_settings: Mapping[str, Any], **overrides: Any) -> GatewayConfig:
    """File settings, then every override that is not None; replicas from both are merged."""
    settings = dict(file_settings)
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "replicas":
            settings["replicas"] = tuple(settings.get("replicas", ())) + tuple(value)
        else:
            settings[key] = value
    try:
        return GatewayConfig(**settings)
    except TypeError as exc:
        raise ConfigError(f"bad gateway setting: {exc}") from exc
