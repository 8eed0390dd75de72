from __future__ import annotations

import math
from pathlib import Path

import pytest

from prefixroute.cli import build_parser
from prefixroute.commands import serve
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


@pytest.mark.parametrize(
    "bad",
    [{"eject_s": math.nan}, {"eject_s": math.inf}, {"eject_s": -1.0},
     {"shutdown_timeout_s": math.nan}, {"shutdown_timeout_s": -1.0}, {"retry_after_s": -1}],
)  # fmt: skip
def test_times_that_are_no_number_or_never_end_are_refused(bad: dict[str, float]) -> None:
    """NaN passed a check for negatives: a replica taken out with ``eject_s = nan`` never came
    back, and a drain bound of NaN crashed the shutdown and cut streams without an end."""
    with pytest.raises(ConfigError, match=next(iter(bad))):
        GatewayConfig(**bad)


def test_a_drain_without_a_bound_is_allowed() -> None:
    assert GatewayConfig(shutdown_timeout_s=math.inf).shutdown_timeout_s == math.inf


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


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    # It was a UnicodeDecodeError out of tomllib: a traceback instead of the one-line error.
    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xfeport = 1\n")
    with pytest.raises(ConfigError, match=r"^config file .*binary.toml is not UTF-8 text"):
        load_toml(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Each used to leak Python's words: "'<=' not supported between instances of 'str'
        # and 'int'", "argument after ** must be a mapping, not int", and the URL 'h' (a string
        # taken one character at a time).
        (
            '[policy_params]\nprefill_tokens_per_s = "fast"\n',
            "parameter prefill_tokens_per_s must be a number, got 'fast'",
        ),
        ("[policy_params]\nstep_tokens = 1.5\n", "parameter step_tokens must be an integer"),
        ("policy_params = 5\n", "policy_params must be a table .*, got 5"),
        ('replicas = "http://127.0.0.1:1"\n', "replicas must be a list, got 'http://127.0.0.1:1'"),
        ('kv_events = "http://a:1=bind:tcp://*:1"\n', "kv_events must be a list, got 'http"),
        ("kv_events = [1]\n", "kv_events must be a list of strings, got 1"),
    ],
)
def test_a_setting_of_the_wrong_type_names_its_key_and_type(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        build_config(load_toml(path))


def test_precise_mode_without_a_tokenizer_fails_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It started the emulated replicas first, and failed only when the app was built.
    started: list[object] = []
    monkeypatch.setattr(serve, "EmulatedCluster", lambda *a, **k: started.append(a))
    path = tmp_path / "gateway.toml"
    path.write_text('kv_events = ["http://127.0.0.1:18001=connect:tcp://127.0.0.1:5557"]\n')
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "0"])
    with pytest.raises(ConfigError, match=r"needs --tokenizer"):
        serve.run(args)
    args.tokenizer = str(Path(__file__).parents[1] / "data" / "tiny-tokenizer")
    # With one: the KV events name replicas, and none is given (the emulated have no events).
    with pytest.raises(ConfigError, match="kv_events name replicas, but no replica is given"):
        serve.run(args)
    assert started == []


def test_a_replica_s_own_speed_priors_from_the_file_and_the_flag(tmp_path: Path) -> None:
    from prefixroute.core import SpeedPrior

    path = tmp_path / "gw.toml"
    path.write_text(TOML + "prefill_tokens_per_s = 40000\ndecode_step_s = 0.02\nmax_running = 64\n")
    args = build_parser().parse_args([
        "serve", "--config", str(path), "--replica", "http://10.0.0.3:8000",
        "--replica-speed", "http://10.0.0.3:8000=prefill_tokens_per_s=2500.5,max_running=8",
    ])  # fmt: skip
    cfg = config_from_args(args)
    assert cfg.replica_speed_priors() == {
        "http://10.0.0.2:8000": SpeedPrior(40_000.0, 0.02, max_running=64),
        "http://10.0.0.3:8000": SpeedPrior(prefill_tokens_per_s=2_500.5, max_running=8),
    }


@pytest.mark.parametrize(
    "extra",
    ['prefill_tokens_per_s = "fast"\n', "weight = 2\n", "prefill_tokens_per_s = true\n",
     "prefill_tokens_per_s = -1.0\n", "max_running = 0.5\n"],
    ids=["not-a-number", "unknown-key", "a-boolean", "negative", "a-part-batch"],
)  # fmt: skip
def test_a_replica_entry_with_bad_speed_priors_is_refused(tmp_path: Path, extra: str) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(TOML + extra)
    with pytest.raises(ConfigError):
        build_config(load_toml(path))


@pytest.mark.parametrize(
    "spec",
    ["http://a:1", "http://a:1=", "http://a:1=prefill=5", "http://a:1=prefill_tokens_per_s=x",
     "http://a:1=decode_step_s=-1", "=prefill_tokens_per_s=5", "http://a:1=max_running=0",
     "http://a:1=max_running=2.5"],
)  # fmt: skip
def test_a_bad_replica_speed_flag_is_refused(spec: str) -> None:
    with pytest.raises(ConfigError):
        GatewayConfig(replicas=("http://a:1",), replica_speeds=(spec,))


def test_one_replica_s_speed_priors_once() -> None:
    with pytest.raises(ConfigError, match="one entry per replica"):
        GatewayConfig(replica_speeds=("http://a:1=prefill_tokens_per_s=5",) * 2)


def test_a_config_file_without_end_is_refused_at_a_bound(tmp_path: Path) -> None:
    """``--config /dev/zero`` read until the kernel killed the process; a file too big to be a
    config is refused in one line instead."""
    from prefixroute.gateway._config_file import MAX_CONFIG_BYTES

    with pytest.raises(ConfigError, match=r"^config file /dev/zero is over 16 MiB$"):
        load_toml("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * MAX_CONFIG_BYTES + b"\n")
    with pytest.raises(ConfigError, match="is over 16 MiB"):
        load_toml(big)
    near = tmp_path / "near.toml"  # a comment under the bound is still a config
    near.write_bytes(b"# " + b"x" * (MAX_CONFIG_BYTES - 20) + b"\nport = 1\n")
    assert load_toml(near) == {"port": 1}


@pytest.mark.parametrize(
    "url",
    [
        "http://h:99999", "http://:4317", "http://[::1:4317", "grpc://h:4317", "http://h:0",
        "http://h", "http://h:", "http://h :4317",
    ],
)
def test_an_otlp_endpoint_that_is_no_address_is_refused(url: str) -> None:
    """The exporter took these and failed in its own thread once spans flowed."""
    with pytest.raises(ConfigError, match=r"^otlp_endpoint must be http\(s\)://HOST:PORT"):
        GatewayConfig(replicas=("http://127.0.0.1:1",), otlp_endpoint=url)
    GatewayConfig(replicas=("http://127.0.0.1:1",), otlp_endpoint="http://[::1]:4317")
