"""The [tenancy] table of the config file, and the gateway settings around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixroute.cli import build_parser
from prefixroute.commands.serve import config_from_args
from prefixroute.core import ConfigError
from prefixroute.gateway import (
    GatewayConfig,
    TenancyConfig,
    TenantLimits,
    TenantSpec,
    build_config,
    hash_api_key,
    load_toml,
)

KEY = "pr-" + "k" * 40

TOML = f"""
port = 9000

[tenancy]
isolation = true
header = "x-team"
cache_salt_secret = "0123456789abcdef0123"
shareable_prefixes = ["system: shared\\n"]

[tenancy.default_limits]
prompt_tokens_per_minute = 100000
requests_per_second = 20

[[tenancy.tenants]]
name = "team-a"
max_in_flight = 3
requests_per_second = 5.5
api_key_sha256 = ["{hash_api_key(KEY)}"]

[[tenancy.tenants]]
name = "team-b"
cache_salt = "b-salt"
"""


def test_tenancy_table(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(TOML)
    t = build_config(load_toml(path)).tenancy
    assert t.isolation and t.header == "x-team" and t.requires_api_key
    assert t.shareable_prefixes == ("system: shared\n",)
    assert t.default_limits == TenantLimits(requests_per_second=20, prompt_tokens_per_minute=100000)
    a = t.spec("team-a")
    assert a is not None and a.api_key_sha256 == (hash_api_key(KEY),)
    assert a.limits.over(t.default_limits) == TenantLimits(
        requests_per_second=5.5, prompt_tokens_per_minute=100000, max_in_flight=3
    )
    b = t.spec("team-b")
    assert b is not None and b.cache_salt == "b-salt" and not b.api_key_sha256


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("[tenancy]\nisolate = true", r"unknown \[tenancy\] setting"),
        ('[[tenancy.tenants]]\nname = "a"\nrps = 3', "unknown limit"),
        ('[[tenancy.tenants]]\nname = "a"\napi_key_sha256 = ["pr-plain-key"]', "never the key"),
        ('[[tenancy.tenants]]\nname = "a b"', "tenant name"),
        ('[[tenancy.tenants]]\nname = "a"\nmax_in_flight = 0', "positive"),
        ('[[tenancy.tenants]]\nname = "a"\nburst = 1.5', "whole number"),
        # TOML has inf: a rate nobody can size a bucket with (it was a 500 on every request)
        ("[tenancy.default_limits]\nrequests_per_second = inf", "positive finite"),
        ('[[tenancy.tenants]]\nname = "a"\nrequests_per_second = inf', "positive finite"),
        ('[tenancy]\nheader = "authorization"', "cannot be"),
        ('[tenancy]\ncache_salt_secret = "short"', "at least 16"),
        ('[[tenancy.tenants]]\nname = "a"\n[[tenancy.tenants]]\nname = "a"', "once"),
        # wrong types: one line each, never a traceback, and a string never reads as true
        ("[tenancy]\ndefault_limits = 5", "table of limits"),
        ("[tenancy]\ntenants = 5", r"\[\[tenancy.tenants\]\] tables"),
        ('[tenancy]\nisolation = "false"', "isolation must be true or false"),
        ('[tenancy]\nisolation = ""', "isolation must be true or false"),
        ("[tenancy]\nisolation = 1", "isolation must be true or false"),
        ("[tenancy]\nheader = 5", "header must be a header name"),
        ("[tenancy]\ndefault_tenant = 5", "default_tenant must be a tenant name"),
        ("[tenancy]\ncache_salt_secret = 12345678901234567", "cache_salt_secret must be a string"),
        ("[tenancy]\nmax_tenants = true", "max_tenants must be a whole number"),
        ("[tenancy]\nmax_tenants = 2.5", "max_tenants must be a whole number"),
        # an integer past any float (a JSON body of the admin API carries such; TOML only int64)
        ("[tenancy.default_limits]\nburst = 9223372036854775807", "burst must be at most"),
    ],
)
def test_bad_tenancy_settings_fail_at_start(tmp_path: Path, snippet: str, message: str) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(snippet)
    with pytest.raises(ConfigError, match=message):
        build_config(load_toml(path))


def test_one_key_one_tenant() -> None:
    digest = hash_api_key(KEY)
    with pytest.raises(ConfigError, match="one tenant"):
        TenancyConfig(tenants=(TenantSpec("a", (digest,)), TenantSpec("b", (digest,))))


def test_admin_listener_settings() -> None:
    with pytest.raises(ConfigError, match="admin token"):
        GatewayConfig(admin_port=9001)
    with pytest.raises(ConfigError, match="admin_port"):
        GatewayConfig(admin_host="0.0.0.0", admin_token="x" * 12)
    with pytest.raises(ConfigError, match="out of range"):
        GatewayConfig(admin_port=70000, admin_token="x" * 12)
    with pytest.raises(ConfigError, match="positive"):
        GatewayConfig(client_header_timeout_s=0)


def test_security_flags() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--admin-token",
            "x" * 12,
            "--admin-host",
            "127.0.0.2",
            "--admin-port",
            "9001",
            "--log-bodies",
        ]
    )
    cfg = config_from_args(args)
    assert (cfg.admin_host, cfg.admin_port, cfg.log_bodies) == ("127.0.0.2", 9001, True)
    assert config_from_args(build_parser().parse_args(["serve"])).log_bodies is False
