"""The gateway's settings and the TOML file they can come from (format in ``CONFIG_HELP``)."""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixroute.core import DEFAULT_POLICY, ConfigError, make_policy
from prefixroute.events import EventEndpoint
from prefixroute.gateway._tenant_config import TenancyConfig, tenancy_from_toml

CONFIG_HELP = """\
config file (--config FILE, TOML): every GatewayConfig field by name, the replica list and
the policy's parameters. Flags given on the command line override the file.

    # gateway.toml -- prefixroute serve --config gateway.toml
    host = "0.0.0.0"
    port = 8000
    policy = "predicted_ttft"          # any name from `prefixroute simulate --help`
    # Secrets from files or the environment, not the command line (docs/security.md):
    # admin_token_file = "/run/secrets/admin-token"     # or $PREFIXROUTE_ADMIN_TOKEN
    # upstream_api_key_file = "/run/secrets/vllm-key"  # or $PREFIXROUTE_UPSTREAM_API_KEY
    block_chars = 64                   # characters per routing block
    read_timeout_s = 300.0
    # Precise mode: the replicas' own KV events and token-exact keys (docs/vllm.md).
    # tokenizer = "/models/llama/"     # local HF tokenizer dir (never downloaded)
    # kv_block_size = 16               # the engines' --block-size
    # kv_events = ["http://10.0.0.11:8000=connect:tcp://10.0.0.11:5557",
    #              "http://10.0.0.12:8000=bind:tcp://0.0.0.0:5602"]
    # speculative_ttl_s = 2.0          # seconds a decision counts before its events
    # Several instances: share routing decisions and load (docs/deployment.md); in precise
    # mode the decisions become speculative entries and no history is kept.
    # sync_redis = "redis://10.0.0.5:6379/0"
    # sync_channel = "prefixroute:routed"  # one channel per gateway fleet
    # sync_history = 4096              # decisions kept for instances that start later

    [policy_params]                    # fields of the policy's config dataclass
    prefill_tokens_per_s = 12000.0

    [[replicas]]
    url = "http://10.0.0.11:8000"

    [[replicas]]
    url = "http://10.0.0.12:8000"

Tenants, API keys, limits and isolation (docs/security.md has the whole reference; the
admin API can listen on its own address: admin_host, admin_port):

    [tenancy]
    isolation = true                   # per-tenant prefix keys and vLLM cache_salt
    cache_salt_secret = "a long random string"
    [tenancy.default_limits]
    requests_per_second = 20
    prompt_tokens_per_minute = 1000000
    max_in_flight = 64
    [[tenancy.tenants]]
    name = "team-a"
    api_key_sha256 = ["fa703e12fd6be9fd7f09e60202dfb96aaf1efa0d384639c6e17747bc2bfc2a17"]
    requests_per_second = 5

Other fields: max_body_bytes, max_in_flight, max_in_flight_per_replica, retry_after_s,
connect_timeout_s, health_interval_s, health_timeout_s, scrape_metrics, failure_threshold,
eject_s, shutdown_timeout_s, index_capacity_blocks, kv_block_size, seed,
client_header_timeout_s, client_body_timeout_s, log_bodies, upstream_api_key, admin_host,
first_byte_floor_s, first_byte_cap_s, client_buffer_bytes, client_write_timeout_s,
expose_replica_urls.
"""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"  # address to bind
    port: int = 8000  # port to bind; 0 picks a free one
    replicas: tuple[str, ...] = ()  # replica base URLs at start
    policy: str = DEFAULT_POLICY  # routing policy, by registry name
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # policy config overrides
    # bearer token of /admin/*; None disables the admin API (kept out of the config's repr)
    admin_token: str | None = field(default=None, repr=False)
    admin_host: str | None = None  # address of a separate admin listener (default: host)
    admin_port: int | None = None  # port of a separate admin listener; None: /admin/* on port
    block_chars: int = 64  # characters (or token ids) per routing block
    index_capacity_blocks: int | None = 16384  # prefix-index entries per replica, blocks
    kv_block_size: int = 16  # replicas' tokens per KV block (load view; token-mode key blocks)
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
    # A stream's first event must arrive within clamp(4 x predicted TTFT, floor, cap), else the
    # attempt is abandoned and retried elsewhere (before any byte reached the client).
    first_byte_floor_s: float = 10.0  # shortest first-byte deadline, seconds
    first_byte_cap_s: float = 120.0  # longest first-byte deadline, seconds
    client_buffer_bytes: int = 1024 * 1024  # stream bytes held for a slow client, bytes
    client_write_timeout_s: float = 30.0  # a client not reading for this long is cut, s
    expose_replica_urls: bool = False  # name replicas by URL towards clients (else by r-<hash>)
    client_header_timeout_s: float = 60.0  # a connection's next request must arrive within, s
    client_body_timeout_s: float = 60.0  # a request body must arrive within, s (else 408)
    log_bodies: bool = False  # debug: log request and response bodies (prompts!) at INFO
    # sent to replicas as the bearer token (vLLM --api-key); kept out of the config's repr
    upstream_api_key: str | None = field(default=None, repr=False)
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)  # tenants, keys, limits
    seed: int = 0  # router randomness (tie breaks)
    tokenizer: str | None = None  # local HF tokenizer dir: key requests by engine token blocks
    kv_events: tuple[str, ...] = ()  # "REPLICA_URL=bind|connect:ADDR[,replay=ADDR]" per replica
    speculative_ttl_s: float = 2.0  # precise mode: how long a decision counts as cached, s
    sync_redis: str | None = None  # redis:// URL: share routing decisions with other instances
    sync_channel: str = "prefixroute:routed"  # Redis PUB/SUB channel of the decisions
    sync_history: int = 4096  # decisions kept in Redis for instances that start later; 0 = none

    @property
    def precise(self) -> bool:
        """Precise mode: the prefix index follows the replicas' KV events."""
        return bool(self.kv_events)

    def kv_event_endpoints(self) -> dict[str, EventEndpoint]:
        """``kv_events`` parsed: replica URL (as written) -> endpoint; raises ConfigError."""
        out: dict[str, EventEndpoint] = {}
        for item in self.kv_events:
            url, sep, spec = item.partition("=")
            if not sep or not url.strip():
                raise ConfigError(f"--kv-events takes REPLICA_URL=bind|connect:ADDR, got {item!r}")
            if url.strip() in out:
                raise ConfigError(f"two KV-event streams for replica {url.strip()}")
            out[url.strip()] = EventEndpoint.parse(spec)
        return out

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
            "first_byte_floor_s": self.first_byte_floor_s,
            "client_buffer_bytes": self.client_buffer_bytes,
            "client_write_timeout_s": self.client_write_timeout_s,
        }
        bad = [name for name, value in positive.items() if value <= 0]
        if bad:
            raise ConfigError(f"gateway settings must be positive: {', '.join(bad)}")
        if self.first_byte_cap_s < self.first_byte_floor_s:
            raise ConfigError("first_byte_cap_s must not be below first_byte_floor_s")
        if self.index_capacity_blocks is not None and self.index_capacity_blocks < 1:
            raise ConfigError("index_capacity_blocks must be positive (or unset for unbounded)")
        if min(self.eject_s, self.shutdown_timeout_s, self.retry_after_s) < 0:
            raise ConfigError("eject_s, shutdown_timeout_s and retry_after_s must not be negative")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port out of range: {self.port}")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ConfigError("the admin token must be at least 8 characters")
        if not self.speculative_ttl_s > 0:
            raise ConfigError("speculative_ttl_s must be positive")
        self.kv_event_endpoints()  # malformed specs fail here, at start
        if self.sync_redis is not None:
            if not self.sync_redis.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError(f"sync_redis must be a redis:// URL, got {self.sync_redis!r}")
            if not self.sync_channel:
                raise ConfigError("sync_channel must not be empty")
        if self.sync_history < 0:
            raise ConfigError(f"sync_history must be 0 or more, got {self.sync_history}")
        if self.admin_port is not None and not 0 <= self.admin_port < 65536:
            raise ConfigError(f"admin port out of range: {self.admin_port}")
        if self.admin_host is not None and self.admin_port is None:
            raise ConfigError("admin_host needs admin_port (a separate admin listener)")
        if self.admin_port is not None and self.admin_token is None:
            raise ConfigError("admin_port needs an admin token: without one there is no admin API")
        if not (self.client_header_timeout_s > 0 and self.client_body_timeout_s > 0):
            raise ConfigError("client_header_timeout_s and client_body_timeout_s must be positive")
        if not isinstance(self.tenancy, TenancyConfig):
            raise ConfigError("tenancy must be a TenancyConfig (a [tenancy] table in the file)")
        make_policy(self.policy, **self.policy_params)  # unknown names fail here, at start


_FIELDS = {f.name for f in dataclasses.fields(GatewayConfig)}
# TOML keys naming a file that holds a secret field's value (a mounted Kubernetes Secret, say).
SECRET_FILES = {"admin_token_file": "admin_token", "upstream_api_key_file": "upstream_api_key"}


def read_secret(path: str | Path, what: str) -> str:
    """The secret in file ``path``, without its trailing newline; ConfigError when the file
    cannot be read, is empty, or holds more than one line (a header value cannot)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the {what} file {path} is not UTF-8 text") from exc
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"the {what} file {path} is empty")
    if "\n" in secret or "\r" in secret:
        raise ConfigError(f"the {what} file {path} holds more than one line")
    return secret


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
        elif key == "tenancy":
            out[key] = tenancy_from_toml(value, str(path))
        elif key == "kv_events":
            out[key] = tuple(value) if isinstance(value, list) else value
        elif key in SECRET_FILES:
            if SECRET_FILES[key] in raw:
                raise ConfigError(f"config file {path}: {SECRET_FILES[key]} or {key}, not both")
            if not isinstance(value, str):
                raise ConfigError(f"config file {path}: {key} must be a file path")
            out[SECRET_FILES[key]] = read_secret(value, SECRET_FILES[key].replace("_", " "))
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
    """File settings, then every override that is not None; replicas from both are merged.

    An override named in ``SECRET_FILES`` (``admin_token_file=PATH``) sets its secret field to
    the file's contents."""
    settings = dict(file_settings)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in SECRET_FILES:
            settings[SECRET_FILES[key]] = read_secret(value, SECRET_FILES[key].replace("_", " "))
        elif key in ("replicas", "kv_events"):
            settings[key] = tuple(settings.get(key, ())) + tuple(value)
        else:
            settings[key] = value
    try:
        return GatewayConfig(**settings)
    except TypeError as exc:
        raise ConfigError(f"bad gateway setting: {exc}") from exc
