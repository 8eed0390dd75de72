"""Tenant settings: who the tenants are, their API keys (hashed), their limits, and isolation.

In the TOML config file they live under ``[tenancy]`` (the example is in ``--help``'s config
file section, ``_config_file.CONFIG_HELP``): ``isolation`` (per-tenant prefix keys and vLLM
``cache_salt``), ``header`` (the tenant of a request when no API keys are configured),
``cache_salt_secret``, ``shareable_prefixes``, then ``[tenancy.default_limits]`` (every
tenant's, unless its own entry says otherwise) and one ``[[tenancy.tenants]]`` table per tenant
(``name``, ``api_key_sha256`` from ``prefixroute hash-key``, and limits that override the
default field by field).

A limit that is not set anywhere is not enforced. See ``docs/security.md``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixroute.core import ConfigError

TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")  # header values and config names
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
DEFAULT_HEADER = "x-tenant-id"
DEFAULT_TENANT = "default"
LIMIT_NAMES = ("requests_per_second", "burst", "prompt_tokens_per_minute", "max_in_flight")
MAX_LIMIT = 10**15  # the largest limit taken: far past any rate or count, well within a float


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's limits; a field left None falls back to the defaults (then: no limit)."""

    requests_per_second: float | None = None  # sustained request rate, requests/s
    burst: int | None = None  # requests allowed at once above the rate (default: one second's)
    prompt_tokens_per_minute: int | None = None  # prompt tokens per minute (estimate, then usage)
    max_in_flight: int | None = None  # requests of this tenant in flight at once

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            value = getattr(self, name)
            if value is None:
                continue
            # Finite too: TOML and JSON both carry inf, and an infinite rate cannot size a bucket;
            # and within a float's range (a JSON integer of 400 digits overflowed to a 500).
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_LIMIT:
                raise ConfigError(f"tenant limit {name} must be at most {MAX_LIMIT:.0e}")
            if (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
                or not math.isfinite(value)
            ):
                raise ConfigError(
                    f"tenant limit {name} must be a positive finite number, got {value!r}"
                )
            if name != "requests_per_second" and not float(value).is_integer():
                raise ConfigError(f"tenant limit {name} must be a whole number, got {value!r}")

    def over(self, base: TenantLimits) -> TenantLimits:
        """These limits, with ``base``'s value wherever this one has none."""
        return TenantLimits(
            **{n: getattr(self, n) if getattr(self, n) is not None else getattr(base, n)
               for n in LIMIT_NAMES}
        )  # fmt: skip

    def as_dict(self) -> dict[str, float | int | None]:
        return {n: getattr(self, n) for n in LIMIT_NAMES}


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant named in the config."""

    name: str
    api_key_sha256: tuple[str, ...] = ()  # SHA-256 hex digests of its API keys (never the keys)
    cache_salt: str | None = None  # explicit salt; tenants with the same salt share cache entries
    limits: TenantLimits = field(default_factory=TenantLimits)

    def __post_init__(self) -> None:
        check_tenant_name(self.name)
        for digest in self.api_key_sha256:
            if not SHA256_HEX.fullmatch(digest):
                raise ConfigError(
                    f"tenant {self.name!r}: api_key_sha256 entries are 64 lowercase hex digits "
                    "(`prefixroute hash-key`), never the key itself"
                )
        if self.cache_salt is not None and not self.cache_salt:
            raise ConfigError(f"tenant {self.name!r}: cache_salt must not be empty")


@dataclass(frozen=True, slots=True)
class TenancyConfig:
    isolation: bool = False  # seed each tenant's prefix keys and send it a cache_salt
    header: str = DEFAULT_HEADER  # request header naming the tenant (no API keys configured)
    default_tenant: str = DEFAULT_TENANT  # tenant of requests that name none
    tenants: tuple[TenantSpec, ...] = ()
    default_limits: TenantLimits = field(default_factory=TenantLimits)
    cache_salt_secret: str | None = None  # derives salts; None: a random one per process
    shareable_prefixes: tuple[str, ...] = ()  # routing-key prefixes shared across tenants
    max_tenants: int = 10_000  # tenants whose counters are kept at once (idle ones are dropped)

    def __post_init__(self) -> None:
        check_tenant_name(self.default_tenant)
        if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", self.header):
            raise ConfigError(f"tenancy.header must be a header name, got {self.header!r}")
        if self.header.lower() in ("authorization", "host", "content-length", "x-request-id"):
            raise ConfigError(f"tenancy.header cannot be {self.header!r}")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ConfigError("tenancy.tenants: each tenant name may appear once")
        digests = [d for t in self.tenants for d in t.api_key_sha256]
        if len(set(digests)) != len(digests):
            raise ConfigError("tenancy.tenants: an API key may belong to one tenant only")
        if self.cache_salt_secret is not None and len(self.cache_salt_secret) < 16:
            raise ConfigError("tenancy.cache_salt_secret must be at least 16 characters")
        if any(not p for p in self.shareable_prefixes):
            raise ConfigError("tenancy.shareable_prefixes must not contain an empty prefix")
        if self.max_tenants < 1:
            raise ConfigError("tenancy.max_tenants must be positive")

    @property
    def requires_api_key(self) -> bool:
        """API keys are configured: every /v1 request must carry one."""
        return any(t.api_key_sha256 for t in self.tenants)

    def spec(self, name: str) -> TenantSpec | None:
        return next((t for t in self.tenants if t.name == name), None)


def check_tenant_name(name: object) -> str:
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise ConfigError(
            f"a tenant name is 1-64 characters of letters, digits and ._:@- "
            f"(starting with a letter or digit), got {name!r}"
        )
    return name


# --- TOML -------------------------------------------------------------------------------------
_TENANCY_FIELDS = {f.name for f in dataclasses.fields(TenancyConfig)}
_SPEC_FIELDS = {"name", "api_key_sha256", "cache_salt"}
_SCALARS = (  # [tenancy] settings of one type: name, type, how to say it
    ("isolation", bool, "true or false"),
    ("header", str, "a header name"),
    ("default_tenant", str, "a tenant name"),
    ("cache_salt_secret", str, "a string"),
    ("max_tenants", int, "a whole number"),
)


def limits_from(raw: object, where: str) -> TenantLimits:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a table of limits, got {raw!r}")
    unknown = set(raw) - set(LIMIT_NAMES)
    if unknown:
        raise ConfigError(f"{where}: unknown limit(s) {', '.join(sorted(unknown))}")
    try:
        return TenantLimits(**raw)
    except TypeError as exc:  # pragma: no cover - unknown names are caught above
        raise ConfigError(f"{where}: {exc}") from exc


def tenancy_from_toml(raw: object, where: str) -> TenancyConfig:
    """The ``[tenancy]`` table of a config file; raises ConfigError naming ``where``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: [tenancy] must be a table")
    unknown = set(raw) - _TENANCY_FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown [tenancy] setting(s) {', '.join(sorted(unknown))}")
    settings: dict[str, Any] = dict(raw)
    for name, kind, said in _SCALARS:  # a string "false" must not read as true
        value = settings.get(name)
        wrong = not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
        if name in settings and wrong:
            raise ConfigError(f"{where}: tenancy.{name} must be {said}, got {value!r}")
    if "default_limits" in settings:
        settings["default_limits"] = limits_from(
            settings["default_limits"], f"{where} [tenancy.default_limits]"
        )
    if "shareable_prefixes" in settings:
        prefixes = settings["shareable_prefixes"]
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise ConfigError(f"{where}: tenancy.shareable_prefixes must be a list of strings")
        settings["shareable_prefixes"] = tuple(prefixes)
    tenants = raw.get("tenants", ())
    if not isinstance(tenants, list | tuple):
        raise ConfigError(f"{where}: tenancy.tenants must be [[tenancy.tenants]] tables")
    settings["tenants"] = tuple(
        _spec_from_toml(item, f"{where} [[tenancy.tenants]]") for item in tenants
    )
    try:
        return TenancyConfig(**settings)
    except TypeError as exc:
        raise ConfigError(f"{where}: bad [tenancy] setting: {exc}") from exc


def _spec_from_toml(item: object, where: str) -> TenantSpec:
    if not isinstance(item, Mapping) or "name" not in item:
        raise ConfigError(f"{where}: each entry needs a name")
    limits = {k: v for k, v in item.items() if k not in _SPEC_FIELDS}
    keys = item.get("api_key_sha256", ())
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list | tuple) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(f"{where}: api_key_sha256 must be a list of hex digests")
    salt = item.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise ConfigError(f"{where}: cache_salt must be a string")
    return TenantSpec(
        name=check_tenant_name(item["name"]),
        api_key_sha256=tuple(k.lower() for k in keys),
        cache_salt=salt,
        limits=limits_from(limits, f"{where} {item['name']!r}"),
    )
