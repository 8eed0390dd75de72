"""The gateway's settings: one declaration per field, from which everything else is made.

Each :class:`GatewayConfig` field is declared with :func:`setting`: its default, a one-line help
(units included) and, when it has one, its ``prefixroute serve`` flag. The TOML keys are the
field names; ``prefixroute.commands._settings`` makes the ``serve`` (and ``epp``) flags and
``--help`` from :func:`config_fields`, and ``scripts/config_table.py`` writes the table in
docs/configuration.md from the same list, so a new field is stated once. ``_config_file``
reads the TOML file.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prefixroute._pool import IDLE_TIMEOUT_S
from prefixroute.core import DEFAULT_POLICY, ConfigError, SpeedPrior, make_policy, policy_names
from prefixroute.events import EventEndpoint
from prefixroute.gateway._config_specs import check_otlp_endpoint as _check_otlp
from prefixroute.gateway._config_specs import parse_kv_events, parse_replica_speeds
from prefixroute.gateway._tenant_config import TenancyConfig
from prefixroute.sync import SECRET_ENV, check_url

T = TypeVar("T")
ADMIN_TOKEN_ENV = "PREFIXROUTE_ADMIN_TOKEN"
UPSTREAM_API_KEY_ENV = "PREFIXROUTE_UPSTREAM_API_KEY"
SYNC_SECRET_ENV = SECRET_ENV  # sync_redis's signatures (sync/_signing.py)

# Probing every replica (and scraping its /metrics) more often than this spins a CPU on probes
# and floods the replicas: 0.0001 s was taken as is.
MIN_HEALTH_INTERVAL_S = 0.01


@dataclass(frozen=True, slots=True)
class Setting:
    """How one field is documented and set, kept in the field's ``metadata``."""

    help: str  # what it sets, with its unit: the flag's help and docs/configuration.md's "meaning"
    flag: str | None = None  # its ``prefixroute serve`` flag; None: the config file only
    metavar: str | None = None  # the flag's value in --help (None: argparse's own)
    # A secret: also read from the file that TOML key / flag ``<name>_file`` names, or from
    # this environment variable; never shown in the config's repr.
    env: str | None = None
    choices: Callable[[], Sequence[str]] | None = None  # the values the flag accepts
    shown_default: str | None = None  # the default as documented, when its repr says little


def setting(
    default: T,
    help: str,
    flag: str | None = None,
    *,
    metavar: str | None = None,
    env: str | None = None,
    choices: Callable[[], Sequence[str]] | None = None,
    shown_default: str | None = None,
    in_repr: bool = True,
) -> T:
    """A config field: its default, help and flag (typed as the default for mypy). A secret
    (``env`` given) stays out of the config's repr, as does a field with ``in_repr=False`` (a
    URL that may carry a password)."""
    meta = {"setting": Setting(help, flag, metavar, env, choices, shown_default)}
    return field(default=default, metadata=meta, repr=env is None and in_repr)


def setting_factory(
    factory: Callable[[], T],
    help: str,
    flag: str | None = None,
    *,
    metavar: str | None = None,
    shown_default: str | None = None,
) -> T:
    """:func:`setting` for a mutable default, made fresh for each config."""
    meta = {"setting": Setting(help, flag, metavar, shown_default=shown_default)}
    made: T = field(default_factory=factory, metadata=meta)
    return made


@dataclass(frozen=True, slots=True)
class ConfigField:
    """One field of :class:`GatewayConfig` as its documentation and flags need it."""

    name: str  # the field's name, and its TOML key
    kind: Any  # its annotated type: int, float | None, tuple[str, ...], ...
    default: Any  # its default value
    setting: Setting

    @property
    def secret_file_key(self) -> str | None:
        """The TOML key (``admin_token_file``) naming a file that holds this secret."""
        return f"{self.name}_file" if self.setting.env is not None else None


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Every setting of a gateway (and of the endpoint picker's routing); checked at once."""

    host: str = setting("127.0.0.1", "address to bind", "--host")
    port: int = setting(8000, "port to bind; 0 picks a free one", "--port")
    replicas: tuple[str, ...] = setting(
        (), "replica base URL, http(s)://HOST:PORT without /v1 (the gateway adds it), once per "
        "replica (file: [[replicas]] url = ...)", "--replica",
        metavar="URL", shown_default="none",
    )  # fmt: skip
    policy: str = setting(DEFAULT_POLICY, "routing policy", "--policy", choices=policy_names)
    policy_params: Mapping[str, Any] = setting_factory(
        dict, "a field of the policy's config, KEY=VALUE (file: a [policy_params] table)",
        "--policy-param", metavar="KEY=VALUE", shown_default="the policy's own",
    )  # fmt: skip
    admin_token: str | None = setting(
        None, "the bearer token of /admin/*", "--admin-token",
        env=ADMIN_TOKEN_ENV,
    )  # fmt: skip
    admin_host: str | None = setting(
        None, "address of a separate admin listener (needs admin_port)", "--admin-host",
        shown_default="host",
    )  # fmt: skip
    admin_port: int | None = setting(
        None, "serve /admin/* on this port only, not on the main port", "--admin-port"
    )
    block_chars: int = setting(64, "characters (or token ids) per routing block", "--block-chars")
    index_capacity_blocks: int | None = setting(
        16384, "prefix-index entries per replica, blocks (none: unbounded)"
    )
    # On by default: the engine knows its KV cache's size; an index smaller than the cache
    # forgets prefixes it still holds, a larger one sends requests after hits that are gone
    # (gateway/_index_size.py). false: index_capacity_blocks.
    index_capacity_from_engine: bool = setting(
        True, "size each replica's index to the KV cache its engine reports (vLLM's "
        "cache_config_info, SGLang's max_total_num_tokens): grown at once, shrunk below "
        "index_capacity_blocks in token mode, or once the characters per token rest on 8 answers",
    )  # fmt: skip
    kv_block_size: int = setting(
        16, "the replicas' KV block size, tokens (load view; token-mode key blocks)",
        "--kv-block-size",
    )  # fmt: skip
    max_body_bytes: int = setting(
        8 * 1024 * 1024, "largest request body accepted, bytes (else 413)", "--max-body-bytes"
    )
    max_in_flight: int = setting(
        4096, "requests the gateway handles at once (else 429)", "--max-in-flight"
    )
    max_in_flight_per_replica: int = setting(
        512, "in flight per replica (all full: 503; epp: 429)", "--max-in-flight-per-replica"
    )
    retry_after_s: int = setting(1, "Retry-After on 429/503, seconds")
    connect_timeout_s: float = setting(
        5.0, "upstream connect timeout, seconds", "--connect-timeout"
    )
    read_timeout_s: float = setting(
        300.0, "longest silence from an upstream, seconds (504 if before the first byte); a "
        "plain answer's whole time, as it is silent until done", "--read-timeout",
    )  # fmt: skip
    upstream_idle_timeout_s: float = setting(
        IDLE_TIMEOUT_S,
        "a pooled connection to a replica idle this long is closed, seconds: keep it below "
        "the replicas' keep-alive timeout (vLLM's and SGLang's: 5 s)",
        "--upstream-idle-timeout",
    )  # fmt: skip
    health_interval_s: float = setting(
        2.0, "active /health probe period, seconds", "--health-interval"
    )
    health_timeout_s: float = setting(5.0, "one probe's and scrape's timeout, seconds (SGLang's "
                                      "/health generates a token: it answers after 1 s)")
    # vLLM, SGLang, TGI and llama.cpp answer /health; a server without one (404) is probed on
    # /v1/models instead (gateway._health), or name its own path here.
    health_path: str = setting(
        "/health", "the path a health probe GETs (200: healthy; 404: /v1/models is probed)",
        "--health-path",
    )  # fmt: skip
    scrape_metrics: bool = setting(
        True, "read the replicas' own load from their /metrics each probe round, and ask "
        "each joining replica its batch size (SGLang's /get_server_info)"
    )  # fmt: skip
    # On by default: a first token measured over HTTP always carries a fixed cost (HTTP,
    # templating, scheduling), tens of ms on real engines; without the term the fit stretches
    # the rate to cover it (docs/results.md, real vLLM). false: the overhead stays at 0.
    learn_ttft_overhead: bool = setting(
        True, "learn each replica's fixed first-token cost (HTTP, templating) beside its speed"
    )
    # On by default: a prompt token costs more the longer the context before it, and a model
    # linear in tokens over-predicts short prompts and under-predicts long ones (docs/results.md,
    # Attention). false: each replica's cost stays linear in its tokens (attention held at 0).
    learn_attention: bool = setting(
        True, "learn how much a prompt token's cost grows with the context before it "
        "(attention) beside each replica's speed",
    )  # fmt: skip
    # Streams report usage only when asked, and most clients do not ask: the gateway asks for
    # them and keeps that usage-only event from the client (gateway._usage). false: streams
    # go as sent (set it when the replicas force usage on every stream and clients expect it).
    stream_usage: bool = setting(
        True, "ask replicas for the usage of streams whose client did not, and keep it from "
        "the client (calibration and cached-token checks need it)",
    )  # fmt: skip
    failure_threshold: int = setting(3, "consecutive failures that take a replica out")
    eject_s: float = setting(5.0, "shortest time out after failures, seconds")
    shutdown_timeout_s: float = setting(
        30.0, "graceful shutdown: how long in-flight requests may finish, seconds"
    )
    # A stream's first event must arrive within clamp(4 x predicted TTFT, floor, cap), else the
    # attempt is retried elsewhere (before any byte reached the client), unless the replica
    # sent others' first tokens or answers meanwhile: it moves on (gateway._first_byte).
    first_byte_floor_s: float = setting(
        10.0, "shortest first-byte deadline, seconds (it moves on while the replica is at work)"
    )
    first_byte_cap_s: float = setting(
        120.0, "longest first-byte deadline, seconds (it moves on while the replica is at work)"
    )
    client_buffer_bytes: int = setting(1024 * 1024, "stream bytes held for a slow client, bytes")
    client_write_timeout_s: float = setting(
        30.0, "a client not reading for this long is cut, seconds"
    )
    expose_replica_urls: bool = setting(
        False, "name replicas by URL towards clients (else r- and 8 hex digits)"
    )
    client_header_timeout_s: float = setting(
        60.0, "a connection's next request must arrive within this, seconds"
    )
    client_body_timeout_s: float = setting(
        60.0, "a request body must arrive within this, seconds (else 408)"
    )
    log_bodies: bool = setting(
        False, "debug only: log request and response bodies (prompt and completion text)",
        "--log-bodies",
    )  # fmt: skip
    upstream_api_key: str | None = setting(
        None, "the key sent to the replicas as their bearer token (vLLM --api-key)",
        env=UPSTREAM_API_KEY_ENV,
    )  # fmt: skip
    tenancy: TenancyConfig = setting_factory(
        TenancyConfig, "tenants, API keys, limits and isolation: a [tenancy] table "
        "(docs/security.md)", shown_default="one tenant, no limits",
    )  # fmt: skip
    seed: int = setting(0, "router randomness (tie breaks)")
    tokenizer: str | None = setting(
        None, "local Hugging Face tokenizer dir (tokenizer.json, tokenizer_config.json): key "
        "requests by the engines' token ids in --kv-block-size blocks (never downloads)",
        "--tokenizer", metavar="DIR",
    )  # fmt: skip
    replica_speeds: tuple[str, ...] = setting(
        (), "a replica's own speed priors, where it differs from the fleet's (another GPU): "
        "URL=prefill_tokens_per_s=N[,decode_step_s=S][,max_running=M] (M: its engine's "
        "batch size, --max-num-seqs; SGLang says it itself); once per replica (file: those "
        "keys in its [[replicas]] entry); each replica's real speed is still learned",
        "--replica-speed", metavar="URL=PRIORS", shown_default="none",
    )  # fmt: skip
    kv_events: tuple[str, ...] = setting(
        (), "precise mode: follow this replica's KV events; SPEC is bind:ADDR (engines connect "
        "to us: vLLM endpoint tcp://GATEWAY:PORT) or connect:ADDR (vLLM binds tcp://*:PORT), "
        "optionally ,replay=ADDR; once per replica; needs --tokenizer",
        "--kv-events", metavar="URL=SPEC", shown_default="none",
    )  # fmt: skip
    kv_events_each: str | None = setting(
        None, "precise mode for every replica without its own --kv-events, however it joins "
        "(--replica, the admin API, the picker's file or pods): SPEC with {host} for the "
        "replica's host; connect:tcp://{host}:5557 follows vLLM's default publisher "
        "(tcp://*:5557) on each; needs --tokenizer",
        "--kv-events-each", metavar="SPEC",
    )  # fmt: skip
    speculative_ttl_s: float = setting(
        2.0, "precise mode: seconds a routing decision counts as cached before its events "
        "arrive", "--speculative-ttl",
    )  # fmt: skip
    sync_redis: str | None = setting(
        None, "several instances: share routing decisions and load through this Redis "
        "(redis://HOST:PORT/DB); Redis down means local-only routing, not errors",
        "--sync-redis", metavar="URL", in_repr=False,  # redis://:PASSWORD@...: shown nowhere
    )  # fmt: skip
    sync_secret: str | None = setting(
        None, "the secret all instances sign their sync_redis messages with (HMAC); others "
        "are dropped. Needed by tenant isolation (docs/security.md)", env=SYNC_SECRET_ENV,
    )  # fmt: skip
    sync_channel: str = setting(
        "prefixroute:routed", "Redis PUB/SUB channel of the decisions, one per gateway fleet"
    )
    sync_history: int = setting(
        4096, "with --sync-redis in approximate mode: keep the last N decisions in Redis, so "
        "an instance that starts or reconnects later begins warm (0: none)",
        "--sync-history", metavar="N",
    )  # fmt: skip
    otlp_endpoint: str | None = setting(
        None, "OpenTelemetry: export a span per request (the decision, every candidate's "
        "score, the upstream call) over OTLP/gRPC to this collector (http://HOST:4317); "
        "unset: no tracing", "--otlp-endpoint", metavar="URL",
    )  # fmt: skip
    trace_service_name: str = setting(
        "prefixroute", "OpenTelemetry service.name of this gateway's spans"
    )

    @property
    def precise(self) -> bool:
        """Precise mode: the prefix index follows the replicas' KV events."""
        return bool(self.kv_events) or self.kv_events_each is not None

    def kv_event_endpoints(self) -> dict[str, EventEndpoint]:
        """``kv_events`` parsed: replica URL (as written) -> endpoint; raises ConfigError."""
        return parse_kv_events(self.kv_events)

    def replica_speed_priors(self) -> dict[str, SpeedPrior]:
        """``replica_speeds`` parsed: replica URL (as written) -> its priors; raises
        ConfigError."""
        return parse_replica_speeds(self.replica_speeds)

    def check_precise(self, has_tokenizer: bool) -> None:
        """Precise mode needs a tokenizer: KV events carry token ids. Not a ``__post_init__``
        check, since an app may be given a tokenizer object apart from the config (tests);
        ``serve`` calls it before it starts anything (emulated replicas included)."""
        if self.precise and not has_tokenizer:
            mode, why = "precise mode (--kv-events, --kv-events-each)", "events carry token ids"
            raise ConfigError(f"{mode} needs --tokenizer: {why}")

    def __post_init__(self) -> None:
        self._check_numbers()
        if not 0 <= self.port < 65536 or not self.host.strip():  # "" bound every interface
            raise ConfigError(f"host and port: an address, and 0-65535: {self.host!r}:{self.port}")
        if self.admin_token is not None and len(self.admin_token) < 8:
            raise ConfigError("the admin token must be at least 8 characters")
        path = self.health_path
        if not path.startswith("/") or path.startswith("//") or any(c.isspace() for c in path):
            raise ConfigError(f"health_path must be a path that starts with /, got {path!r}")
        if not self.speculative_ttl_s > 0:
            raise ConfigError("speculative_ttl_s must be positive")
        self.kv_event_endpoints()  # malformed specs fail here, at start
        if self.kv_events_each is not None:
            EventEndpoint.for_host(self.kv_events_each, "127.0.0.1")  # a bad one fails here
        self.replica_speed_priors()
        if self.sync_redis is not None:
            check_url(self.sync_redis)  # a URL redis-py cannot use fails here, at start
            if not self.sync_channel:
                raise ConfigError("sync_channel must not be empty")
            if self.tenancy.isolation and self.sync_secret is None:  # forged owners (_signing)
                raise ConfigError(f"tenant isolation with sync_redis needs sync_secret_file or "
                                  f"${SYNC_SECRET_ENV}: unsigned messages can be forged")
        _check_otlp(self.otlp_endpoint)
        if self.sync_history < 0:
            raise ConfigError(f"sync_history must be 0 or more, got {self.sync_history}")
        if self.admin_port is not None and not 0 <= self.admin_port < 65536:
            raise ConfigError(f"admin port out of range: {self.admin_port}")
        if self.admin_port == self.port != 0 and (self.admin_host or self.host) == self.host:
            raise ConfigError(f"admin_port is port ({self.port}) on one host: give it another")
        if self.admin_host is not None and self.admin_port is None:
            raise ConfigError("admin_host needs admin_port (a separate admin listener)")
        if self.admin_port is not None and self.admin_token is None:
            raise ConfigError("admin_port needs an admin token: without one there is no admin API")
        if not (self.client_header_timeout_s > 0 and self.client_body_timeout_s > 0):
            raise ConfigError("client_header_timeout_s and client_body_timeout_s must be positive")
        if not isinstance(self.tenancy, TenancyConfig):
            raise ConfigError("tenancy must be a TenancyConfig (a [tenancy] table in the file)")
        make_policy(self.policy, **self.policy_params)  # unknown names fail here, at start

    def _check_numbers(self) -> None:
        """Counts, sizes and times in their ranges (part of ``__post_init__``)."""
        positive = {
            "block_chars": self.block_chars,
            "kv_block_size": self.kv_block_size,
            "max_body_bytes": self.max_body_bytes,
            "max_in_flight": self.max_in_flight,
            "max_in_flight_per_replica": self.max_in_flight_per_replica,
            "connect_timeout_s": self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
            "upstream_idle_timeout_s": self.upstream_idle_timeout_s,
            "health_interval_s": self.health_interval_s,
            "health_timeout_s": self.health_timeout_s,
            "failure_threshold": self.failure_threshold,
            "first_byte_floor_s": self.first_byte_floor_s,
            "client_buffer_bytes": self.client_buffer_bytes,
            "client_write_timeout_s": self.client_write_timeout_s,
        }
        # NaN passed "<= 0" (every request then failed, the health loop died): finite too.
        bad = [name for name, value in positive.items() if not 0 < value < math.inf]
        if bad:
            raise ConfigError(f"gateway settings must be positive and finite: {', '.join(bad)}")
        if self.health_interval_s < MIN_HEALTH_INTERVAL_S:  # a probe loop that never rests
            raise ConfigError(f"health_interval_s must be at least {MIN_HEALTH_INTERVAL_S} s, "
                              f"got {self.health_interval_s:g}")  # fmt: skip
        if self.first_byte_cap_s < self.first_byte_floor_s:
            raise ConfigError("first_byte_cap_s must not be below first_byte_floor_s")
        if self.index_capacity_blocks is not None and self.index_capacity_blocks < 1:
            raise ConfigError("index_capacity_blocks must be positive (or unset for unbounded)")
        if not (0 <= self.eject_s < math.inf and 0 <= self.shutdown_timeout_s <= math.inf
                and self.retry_after_s >= 0):  # NaN is neither; inf: a drain that waits for all
            raise ConfigError("eject_s (finite), shutdown_timeout_s, retry_after_s must be >= 0")


def config_fields() -> list[ConfigField]:
    """Every :class:`GatewayConfig` field with its type, default and :class:`Setting`, in
    declaration order: what the flags, ``--help`` and the settings table are made from."""
    hints = typing.get_type_hints(GatewayConfig)
    out = []
    for f in dataclasses.fields(GatewayConfig):
        factory = f.default_factory  # dataclasses.MISSING (not callable) when there is none
        default = factory() if callable(factory) else f.default
        out.append(ConfigField(f.name, hints[f.name], default, f.metadata["setting"]))
    return out
