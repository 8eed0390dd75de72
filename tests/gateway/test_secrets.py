"""Secrets stay off the command line: the admin token and the upstream API key come from a file
or the environment (``--admin-token`` still works, with a warning), and a bad secret file is a
one-line error with a non-zero exit."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from prefixroute import cli
from prefixroute.commands.serve import TOKEN_ENV, UPSTREAM_KEY_ENV, config_from_args
from prefixroute.core import ConfigError
from prefixroute.gateway import GatewayConfig, load_toml

TOKEN = "admin-token-from-a-file"
KEY = "upstream-key-from-a-file"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(UPSTREAM_KEY_ENV, raising=False)


def _config(*argv: str) -> GatewayConfig:
    return config_from_args(cli.build_parser().parse_args(["serve", *argv]))


def _secret(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_flags_read_files_without_the_trailing_newline(tmp_path: Path) -> None:
    config = _config(
        "--admin-token-file", _secret(tmp_path, "token", TOKEN + "\n"),
        "--upstream-api-key-file", _secret(tmp_path, "key", KEY + "\r\n"),
    )  # fmt: skip
    assert (config.admin_token, config.upstream_api_key) == (TOKEN, KEY)


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setenv(UPSTREAM_KEY_ENV, KEY)
    config = _config()
    assert (config.admin_token, config.upstream_api_key) == (TOKEN, KEY)


def test_file_flag_beats_environment_beats_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = tmp_path / "gateway.toml"
    toml.write_text(
        f'admin_token_file = "{_secret(tmp_path, "t0", "from-the-config-file")}"\n'
        f'upstream_api_key_file = "{_secret(tmp_path, "k0", "key-from-the-config-file")}"\n'
    )
    assert _config("--config", str(toml)).admin_token == "from-the-config-file"
    assert _config("--config", str(toml)).upstream_api_key == "key-from-the-config-file"
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "key-from-the-environment")
    config = _config("--config", str(toml))
    assert (config.admin_token, config.upstream_api_key) == (
        "from-the-environment",
        "key-from-the-environment",
    )
    config = _config(
        "--config", str(toml),
        "--admin-token-file", _secret(tmp_path, "t1", TOKEN),
        "--upstream-api-key-file", _secret(tmp_path, "k1", KEY),
    )  # fmt: skip
    assert (config.admin_token, config.upstream_api_key) == (TOKEN, KEY)


def test_config_file_takes_a_secret_or_its_file_not_both(tmp_path: Path) -> None:
    toml = tmp_path / "gateway.toml"
    path = _secret(tmp_path, "t", TOKEN)
    toml.write_text(f'admin_token = "{TOKEN}"\nadmin_token_file = "{path}"\n')
    with pytest.raises(ConfigError, match="not both"):
        load_toml(toml)


def test_token_on_argv_works_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="prefixroute"):
        config = _config("--admin-token", TOKEN)
    assert config.admin_token == TOKEN
    assert "/proc/PID/cmdline" in caplog.text and TOKEN not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="prefixroute"):
        _config()
    assert not caplog.records


def test_token_and_token_file_exclude_each_other(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        _config("--admin-token", TOKEN, "--admin-token-file", _secret(tmp_path, "t", TOKEN))
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("flag", "text", "expected"),
    [
        ("--admin-token-file", None, "No such file"),
        ("--admin-token-file", "", "is empty"),
        ("--admin-token-file", "\n", "is empty"),
        ("--upstream-api-key-file", "", "is empty"),
        ("--upstream-api-key-file", "two\nlines\n", "more than one line"),
    ],
)
def test_bad_secret_file_is_a_one_line_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    flag: str,
    text: str | None,
    expected: str,
) -> None:
    path = tmp_path / "secret"
    if text is not None:
        path.write_text(text)
    assert cli.main(["serve", flag, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("prefixroute: error:"), err
    assert expected in err and str(path) in err, err


def test_bad_secret_file_in_the_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = tmp_path / "gateway.toml"
    toml.write_text(f'upstream_api_key_file = "{tmp_path / "missing"}"\n')
    assert cli.main(["serve", "--config", str(toml)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "upstream api key file" in err, err


def test_secrets_stay_out_of_the_config_repr() -> None:
    config = GatewayConfig(admin_token=TOKEN, upstream_api_key=KEY)
    assert TOKEN not in repr(config) and KEY not in repr(config)


def test_a_redis_password_stays_out_of_the_config_repr() -> None:
    """The sync URL may carry Redis's password (redis://:PASSWORD@host/0)."""
    config = GatewayConfig(sync_redis="redis://:hunter2-redis@127.0.0.1:6379/0")
    assert "hunter2-redis" not in repr(config)
    assert config.sync_redis == "redis://:hunter2-redis@127.0.0.1:6379/0"
