from __future__ import annotations

from pathlib import Path

import pytest

from prefixroute.cli import build_parser
from prefixroute.commands.serve import config_from_args
from prefixroute.core import DEFAULT_POLICY, ConfigError, UnknownPolicy
from prefixroute.gateway import GatewayConfig, build_config, load_toml

TOML = """
port = 9000
policy = "cache_aware"
read_timeout_s = 12.5

[[replicas]]
url = "http://10.0.0.1:8000"

[[replicas]]
url = "http://10.0.0.2:8000"
"""


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(TOML)
    cfg = build_config(load_toml(path))
    assert cfg.port == 9000 and cfg.policy == "cache_aware" and cfg.read_timeout_s == 12.5
    assert cfg.replicas == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(TOML)
    args = build_parser().parse_args(
        ["serve", "--config", str(path), "--port", "9001", "--replica", "http://10.0.0.3:8000"]
    )
    cfg = config_from_args(args)
    assert cfg.port == 9001 and cfg.policy == "cache_aware"
    assert cfg.replicas[-1] == "http://10.0.0.3:8000" and len(cfg.replicas) == 3


def test_defaults_from_the_command_line() -> None:
    cfg = config_from_args(build_parser().parse_args(["serve"]))
    assert cfg.policy == DEFAULT_POLICY and cfg.replicas == () and cfg.admin_token is None


@pytest.mark.parametrize("name", ["round_robin", "predicted_ttft", "kv_cost"])
def test_every_policy_name_is_accepted(name: str) -> None:
    assert build_parser().parse_args(["serve", "--policy", name]).policy == name


def test_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(UnknownPolicy):
        GatewayConfig(policy="nope")
    with pytest.raises(ConfigError):
        GatewayConfig(read_timeout_s=0)
    with pytest.raises(ConfigError):
        GatewayConfig(admin_token="short")
    bad = tmp_path / "bad.toml"
    bad.write_text("colour = 'red'\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_toml(bad)
    bad.write_text("port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_toml(tmp_path / "missing.toml")


def test_the_documented_example_loads(tmp_path: Path) -> None:
    from prefixroute.gateway import CONFIG_HELP

    lines = [ln[4:] for ln in CONFIG_HELP.splitlines() if ln.startswith("    ")]
    path = tmp_path / "example.toml"
    path.write_text("\n".join(lines))
    cfg = build_config(load_toml(path))
    assert cfg.policy_params == {"prefill_tokens_per_s": 12000.0}
    assert len(cfg.replicas) == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('learn_ttft_overhead = "false"', "learn_ttft_overhead must be true or false, got 'false'"),
        ('scrape_metrics = "no"', "scrape_metrics must be true or false"),
        ('health_timeout_s = "1"', "health_timeout_s must be a number"),
        ("eject_s = true", "eject_s must be a number, got True"),
        ("failure_threshold = 2.5", "failure_threshold must be an integer"),
    ],
)
def test_a_scalar_setting_of_another_toml_type_is_refused(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=message):
        load_toml(path)


def test_a_whole_number_is_a_number_setting(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("eject_s = 3\nlearn_ttft_overhead = false\n")
    cfg = build_config(load_toml(path))
    assert (cfg.eject_s, cfg.learn_ttft_overhead) == (3, False)
