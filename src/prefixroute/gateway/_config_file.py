"""The gateway's TOML config file (format in ``CONFIG_HELP``) and settings merged with flags.

The keys are :class:`GatewayConfig`'s field names, plus ``<secret>_file`` for each secret field
(``admin_token_file``: a mounted Kubernetes Secret, say) and the ``[[replicas]]``,
``[policy_params]`` and ``[tenancy]`` tables.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prefixroute.core import ConfigError, SpeedPrior
from prefixroute.gateway._config import GatewayConfig, config_fields
from prefixroute.gateway._tenant_config import tenancy_from_toml

CONFIG_HELP = """\
config file (--config FILE, TOML): every GatewayConfig field by name, the replica list and
the policy's parameters. Flags given on the command line override the file, except --replica,
whose replicas join the file's.

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
    prefill_tokens_per_s = 40000.0     # optional: its own speed priors (a faster GPU, say)

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
"""


_FIELDS = {f.name for f in config_fields()}
_KINDS = {f.name: f.kind for f in config_fields()}
_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
# TOML keys naming a file that holds a secret field's value (a mounted Kubernetes Secret, say).
SECRET_FILES = {key: f.name for f in config_fields() if (key := f.secret_file_key) is not None}


MAX_SECRET_CHARS = 4096  # a token, a key or a secret: far longer is no such thing


def read_secret(path: str | Path, what: str) -> str:
    """The secret in file ``path``, without its trailing newline; ConfigError when the file
    cannot be read, is empty, or holds more than one line (a header value cannot)."""
    try:
        with open(path, encoding="utf-8") as f:  # bounded: /dev/zero was read until memory ran out
            text = f.read(MAX_SECRET_CHARS + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the {what} file {path} is not UTF-8 text") from exc
    if len(text) > MAX_SECRET_CHARS:
        raise ConfigError(f"the {what} file {path} holds more than {MAX_SECRET_CHARS} characters")
    secret = text.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"the {what} file {path} is empty")
    if "\n" in secret or "\r" in secret:
        raise ConfigError(f"the {what} file {path} holds more than one line")
    # A header value cannot carry them: an upstream key with a \x01 made every request a 500.
    if any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in secret):
        raise ConfigError(f"the {what} file {path} holds a control character")
    return secret


# A fleet of 10,000 replicas with their speeds takes about 1 MB. The bound is there because
# --config /dev/zero (or a log file given by mistake) grew the process until the kernel killed it.
MAX_CONFIG_BYTES = 16 << 20


def read_bounded(path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """File ``path``'s bytes; ConfigError ("``what`` ``path`` is over N MiB") past ``limit``,
    read no further: a path may be a device (/dev/zero) or a log given by mistake. OSError
    propagates, for the caller's own words."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is over {limit >> 20} MiB")
    return data


def load_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file, as keyword arguments of :class:`GatewayConfig`."""
    try:
        raw = tomllib.loads(read_bounded(path, MAX_CONFIG_BYTES, "config file").decode())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8; tomllib raises this one bare
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from exc
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "replicas":
            items = _listed(path, key, value)
            out["replicas"] = tuple(_replica_url(path, item) for item in items)
            speeds = tuple(s for s in (_replica_speed(path, item) for item in items) if s)
            if speeds:
                out["replica_speeds"] = speeds
        elif key == "tenancy":
            out[key] = tenancy_from_toml(value, str(path))
        elif key == "kv_events":
            out[key] = tuple(_strings(path, key, value))
        elif key == "policy_params":  # its values are checked by make_policy, which knows them
            if not isinstance(value, Mapping):
                why = "a table ([policy_params] with KEY = VALUE lines)"
                raise ConfigError(f"config file {path}: policy_params must be {why}, got {value!r}")
            out[key] = value
        elif key in SECRET_FILES:
            if SECRET_FILES[key] in raw:
                raise ConfigError(f"config file {path}: {SECRET_FILES[key]} or {key}, not both")
            if not isinstance(value, str):
                raise ConfigError(f"config file {path}: {key} must be a file path")
            out[SECRET_FILES[key]] = read_secret(value, SECRET_FILES[key].replace("_", " "))
        elif key in _FIELDS:
            _check_scalar(path, key, value)
            out[key] = value
        else:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
    return out


def _check_scalar(path: str | Path, key: str, value: object) -> None:
    """A scalar setting of another TOML type is an error: ``"false"`` for a boolean would
    otherwise be taken as true. Other settings are checked where they are built."""
    kind = _KINDS[key]
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    allowed = [k for k in typing.get_args(kind) if k is not type(None)] if union else [kind]
    if not all(k in _SCALARS for k in allowed):
        return
    for k in allowed:
        if k is bool and isinstance(value, bool):
            return
        if k in (int, float) and isinstance(value, int) and not isinstance(value, bool):
            return
        if k in (float, str) and isinstance(value, k):
            return
    names = " or ".join(_SCALARS[k] for k in allowed)
    raise ConfigError(f"config file {path}: {key} must be {names}, got {value!r}")


def _listed(path: str | Path, key: str, value: object) -> list[Any]:
    """``value`` if it is a TOML array (or array of tables): a single string would otherwise
    be taken one character at a time ("http://..." as the replica URL 'h')."""
    if not isinstance(value, list):
        raise ConfigError(f"config file {path}: {key} must be a list, got {value!r}")
    return value


def _strings(path: str | Path, key: str, value: object) -> list[str]:
    items = _listed(path, key, value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"config file {path}: {key} must be a list of strings, got {item!r}")
    return items


def _replica_url(path: str | Path, item: object) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping) and isinstance(item.get("url"), str):
        return str(item["url"])
    raise ConfigError(f"config file {path}: each [[replicas]] entry needs a url")


def _replica_speed(path: str | Path, item: object) -> str | None:
    """A [[replicas]] entry's other keys, its speed priors (``SpeedPrior.from_mapping``
    checks them), as a ``replica_speeds`` spec; None: it has none."""
    if not isinstance(item, Mapping):
        return None
    given = {key: value for key, value in item.items() if key != "url"}
    if not given:
        return None
    try:
        SpeedPrior.from_mapping(given)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: [[replicas]] {item['url']}: {exc}") from None
    return f"{item['url']}={','.join(f'{k}={v!r}' for k, v in given.items())}"


def build_config(file_settings: Mapping[str, Any], **overrides: Any) -> GatewayConfig:
    """File settings, then every override that is not None; replicas from both are merged.

    An override named in ``SECRET_FILES`` (``admin_token_file=PATH``) sets its secret field to
    the file's contents; ``policy_params`` overrides the file's field by field."""
    settings = dict(file_settings)
    for key, value in overrides.items():
        if value is None:
            continue
        if key in SECRET_FILES:
            settings[SECRET_FILES[key]] = read_secret(value, SECRET_FILES[key].replace("_", " "))
        elif key in ("replicas", "kv_events", "replica_speeds"):
            settings[key] = tuple(settings.get(key, ())) + tuple(value)
        elif key == "policy_params":  # flags override the file field by field
            settings[key] = {**settings.get(key, {}), **value}
        else:
            settings[key] = value
    try:
        return GatewayConfig(**settings)
    except TypeError as exc:
        raise ConfigError(f"bad gateway setting: {exc}") from exc
