"""The gateway's settings stated once: ``GatewayConfig``'s field declarations make the ``serve``
flags, ``serve --help``, the TOML keys and the table in docs/configuration.md, and
``--policy-param`` works for ``serve`` and ``bench`` as for ``simulate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefixroute.cli import build_parser, main
from prefixroute.commands._settings import markdown_table, scalar_type, with_table
from prefixroute.commands.serve import config_from_args
from prefixroute.core import ConfigError
from prefixroute.gateway import GatewayConfig, build_config, config_fields, load_toml

CONFIG_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
FLAGGED = [f for f in config_fields() if f.setting.flag and f.setting.env is None]
SAMPLE = {int: "7", float: "7.5", str: "x"}  # a flag value of each scalar type
# A separate admin listener needs a token ($PREFIXROUTE_ADMIN_TOKEN below); its host, its port.
NEEDS = {"admin_host": ["--admin-port", "9"]}


def serve(*argv: str) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_the_readme_table_is_up_to_date() -> None:
    text = CONFIG_DOC.read_text(encoding="utf-8")
    assert with_table(text) == text, "run .venv/bin/python scripts/config_table.py"


def test_the_table_has_every_field_with_its_flag_and_default() -> None:
    rows = markdown_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == [f.name for f in config_fields()]
    assert "| `block_chars` | `--block-chars` | `64` |" in markdown_table()
    assert "| `retry_after_s` | - | `1` |" in markdown_table()


def test_every_flag_sets_its_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag, by its declared name, reaches its field with the field's type."""
    monkeypatch.setenv("PREFIXROUTE_ADMIN_TOKEN", "a-long-token")
    for f in FLAGGED:
        kind = f.kind
        flag = f.setting.flag or ""
        if kind is bool:
            assert getattr(serve(flag), f.name) is True
            assert getattr(serve(), f.name) is False
        elif f.name in ("replicas", "kv_events", "replica_speeds", "policy_params", "policy"):
            continue  # repeatable or checked values: their own tests below
        else:
            value = SAMPLE[scalar_type(kind)]
            # Settings whose values are URLs of a given kind (checked at start).
            value = {
                "sync_redis": "redis://h:1/0", "otlp_endpoint": "http://h:4317",
                "health_path": "/ping",  # a path (checked at start)
                "kv_events_each": "connect:tcp://{host}:5557",  # a template (checked too)
            }.get(f.name, value)  # fmt: skip
            cfg = serve(flag, value, *NEEDS.get(f.name, []))
            assert getattr(cfg, f.name) == scalar_type(kind)(value), f.name


def test_flags_and_defaults_are_the_fields() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    serve_parser = sub.choices["serve"]  # type: ignore[attr-defined]
    by_dest = {a.dest: a for a in serve_parser._actions}
    for f in FLAGGED:
        action = by_dest[f.name]
        assert action.option_strings == [f.setting.flag]
        assert action.default is None  # unset: the file's value (or the field default) holds
    assert serve() == GatewayConfig()


def test_help_states_each_default_and_lists_file_only_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "upstream connect timeout, seconds (default 5.0)" in text
    for f in config_fields():
        if f.setting.flag is None and f.setting.env is None:
            assert f"{f.name} = " in text, f.name


def test_a_flag_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text("connect_timeout_s = 9.0\nretry_after_s = 3\n")
    cfg = serve("--config", str(path), "--connect-timeout", "1.5")
    assert cfg.connect_timeout_s == 1.5 and cfg.retry_after_s == 3


# --- --policy-param ---------------------------------------------------------------------------


def test_serve_policy_param() -> None:
    cfg = serve("--policy", "cache_aware", "--policy-param", "cache_threshold=0.5")
    assert cfg.policy_params == {"cache_threshold": 0.5}
    cfg = serve("--policy", "cache_aware", "--policy-param", "cache_aware.cache_threshold=0.5")
    assert cfg.policy_params == {"cache_threshold": 0.5}
    assert serve().policy_params == {}


def test_serve_policy_param_merges_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        'policy = "predicted_ttft"\n[policy_params]\nprefill_tokens_per_s = 12000.0\n'
        "miss_penalty = 0.25\n"
    )
    cfg = serve("--config", str(path), "--policy-param", "miss_penalty=0.75")
    assert cfg.policy_params == {"prefill_tokens_per_s": 12000.0, "miss_penalty": 0.75}
    assert build_config(load_toml(path)).policy_params["miss_penalty"] == 0.25


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "cache_aware", "--policy-param", "round_robin.x=1"], "gateway runs"),
        (["--policy", "cache_aware", "--policy-param", "nope=1"], "nope"),
        (["--policy", "cache_aware", "--policy-param", "cache_threshold=x"], "bad"),
        (["--policy-param", "no_equals_sign"], "KEY=VALUE"),
    ],
)
def test_serve_bad_policy_params_are_config_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        serve(*argv)


def test_a_policy_param_may_be_written_in_exponent_form() -> None:
    """``1e4`` is a float like ``10000.0`` (it read as a bad int, having no point)."""
    cfg = serve("--policy", "predicted_ttft", "--policy-param", "prefill_tokens_per_s=1e4")
    assert cfg.policy_params == {"prefill_tokens_per_s": 10000.0}
    cfg = serve("--policy", "predicted_ttft", "--policy-param", "prefill_tokens_per_s=12000")
    assert cfg.policy_params == {"prefill_tokens_per_s": 12000}


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "1e4x", ""])
def test_a_bad_policy_param_is_named_in_its_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a number, or not a finite one: one line naming the parameter and the value."""
    argv = [
        "serve",
        "--policy",
        "predicted_ttft",
        "--policy-param",
        f"prefill_tokens_per_s={value}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixroute: error: bad --policy-param value for prefill_tokens_per_s")
    assert repr(value) in err and err.count("\n") == 1, err


def test_bench_policy_param_reaches_the_emulated_gateway(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """cache_aware keeps a conversation on one replica (1,700 prompt tokens computed, the
    article's number); a match threshold no match can pass spreads its turns (5,200)."""
    argv = ["bench", "-w", "seed-conversation", "-n", "5", "--block-size", "1",
            "--time-scale", "0.05", "-p", "cache_aware", "--json"]  # fmt: skip
    assert main([*argv, "--policy-param", "cache_aware.cache_threshold=0.99"]) == 0
    spread = json.loads(capsys.readouterr().out)["policies"][0]
    assert spread["prefill_tokens"] == 5_200
    assert main(argv) == 0
    kept = json.loads(capsys.readouterr().out)["policies"][0]
    assert kept["prefill_tokens"] == 1_700


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "cache_aware", "--policy-param", "round_robin.x=1"], "does not run"),
        (["-p", "cache_aware", "--policy-param", "cache_aware.nope=1"], "no parameter nope"),
        (["--url", "http://127.0.0.1:9", "--policy-param", "cache_aware.x=1"], "omit --url"),
        (["-p", "cache_aware", "--policy-param", "cache_aware.cache_threshold=1e4x"], "1e4x"),
    ],
)
def test_bench_bad_policy_params_fail_before_anything_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-p", "nope"], "--policy"),  # even a name no policy has went unnoticed
        (["-p", "cache_aware"], "--policy"),
        (["-n", "3"], "--emulate"),
        (["--fleet", "2"], "--fleet"),
    ],
)
def test_bench_url_refuses_what_only_emulated_runs_use(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --url the live gateway routes by its own policy: a --policy or --emulate given
    beside it was ignored, exit 0, and the row looked like a measure of that policy (an
    outside review, 2026-12-07). Now it is a one-line error, before anything starts."""
    assert main(["bench", "--url", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "omit --url" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/v1", "http://127.0.0.1:9/proxy/v1/"])
def test_bench_url_ending_in_v1_says_to_drop_it(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "--url", url]) == 2
    assert "without /v1" in capsys.readouterr().err


def test_flag_names_follow_the_rule_serve_help_states() -> None:
    """``serve --help`` tells how to get from a flag to its TOML key; keep that true."""
    for f in FLAGGED:
        snake = (f.setting.flag or "").removeprefix("--").replace("-", "_")
        assert f.name in (snake, f"{snake}_s", f"{snake}s"), f.setting.flag  # replicas
