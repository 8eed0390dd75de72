"""The command line as a newcomer meets it (issue 14's friction list): help that states every
flag's meaning and default, and one-line errors where a traceback used to be."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from prefixroute import cli
from prefixroute._help import DefaultsMixin
from prefixroute.cli import build_parser, main
from prefixroute.sim import SIM_ONLY_COLUMNS, summary_table

EXE = Path(sys.executable).with_name("prefixroute")
# Flags of commands being written elsewhere right now, not yet held to this rule.
PENDING: set[tuple[str, str]] = {("epp", "--verbose")}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_each_command_is_the_commands_module_of_its_name() -> None:
    """A newcomer finds ``prefixroute X``'s code in ``prefixroute/commands/X.py``, and the
    entry point imports exactly those modules, in the order --help lists them."""
    commands = Path(cli.__file__).with_name("commands")
    names = list(_commands())
    modules = [m.__name__.rpartition(".")[2] for m in cli.COMMANDS]
    assert modules == [name.replace("-", "_") for name in names]
    assert {m.__name__ for m in cli.COMMANDS} == {f"prefixroute.commands.{n}" for n in modules}
    on_disk = {p.stem for p in commands.glob("*.py") if not p.stem.startswith("_")}
    assert on_disk == set(modules)  # no command module left out of the entry point


def test_every_flag_has_help_and_states_its_default() -> None:
    gaps = []
    for name, command in _commands().items():
        formatter = command._get_formatter()
        assert isinstance(formatter, DefaultsMixin), name
        for action in command._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            flag = action.option_strings[-1]
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if (name, flag) in PENDING:
                continue
            text = formatter._get_help_string(action) or ""
            if not text.strip():
                gaps.append(f"{name} {flag}: no help")
            default = action.default
            tells = default not in (None, False, True, [], argparse.SUPPRESS)
            if tells and "default" not in text and f"({default})" not in text:
                gaps.append(f"{name} {flag}: default {default!r} not stated")
    assert not gaps, "\n".join(gaps)


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    for name in _commands():
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        assert "``" not in out, f"{name} --help shows reST markup"


def test_demo_help_states_its_own_replica_count(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "replicas (default 5)" in help_text
    assert _commands()["demo"].get_default("replicas") == 5
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "replicas (default 4)" in " ".join(capsys.readouterr().out.split())


_PORT_ARGS = {
    "serve": ["--emulate", "1", "--port", "{port}"],
    "emulate": ["--port", "{port}"],
    # the picker's two listeners, each taken in turn (the other on any free port)
    "epp grpc": ["--endpoint", "127.0.0.1:9", "--http-port", "0", "--grpc-port", "{port}"],
    "epp http": ["--endpoint", "127.0.0.1:9", "--grpc-port", "0", "--http-port", "{port}"],
}


@pytest.mark.parametrize("command", list(_PORT_ARGS))
def test_a_port_in_use_is_one_line_and_a_non_zero_exit(command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [a.format(port=port) for a in _PORT_ARGS[command]]
        done = subprocess.run(
            [str(EXE), command.split()[0], *args],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, NO_COLOR="1"),
        )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"prefixroute: error: cannot listen on 127.0.0.1:{port}: address already in use"
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == [last]


def test_a_host_that_does_not_resolve_says_so() -> None:
    """The resolver's error carries an EAI_* code, which os.strerror read as "unknown error -2"."""
    done = subprocess.run(
        [str(EXE), "serve", "--emulate", "1", "--port", "0", "--host", "no-such-host.invalid"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("prefixroute: error: cannot listen on no-such-host.invalid:0: ")
    assert "unknown error" not in last and ("name" in last or "address" in last), last


def test_live_reports_hide_simulation_only_columns() -> None:
    ms = {"p50": 1.0, "p90": 2.0, "p99": 3.0}
    metrics: list[Any] = [SimpleNamespace(
        policy="round_robin", prefill_tokens=10, cached_tokens=5, floor_ratio=1.0, hit_rate=0.5,
        ttft_ms=ms, e2e_ms=ms, goodput_rps=1.0, evictions=0, decision_us=ms,
        per_replica_requests={"r0": 1},
    )]  # fmt: skip
    simulated = [c.header for c in summary_table(metrics, "t").columns]
    live = [c.header for c in summary_table(metrics, "t", live=True).columns]
    assert set(SIM_ONLY_COLUMNS) <= set(simulated)
    assert not set(SIM_ONLY_COLUMNS) & set(live)
    assert [c for c in simulated if c not in SIM_ONLY_COLUMNS] == live


_BAD_INPUT = {
    # Each was a traceback (rc 1) or, for --replica, a gateway that took the replica out.
    "epp endpoints file not UTF-8": (
        ["epp", "--endpoints-file", "{bin}", "--grpc-port", "0", "--http-port", "0"],
        "cannot read the endpoints file {bin}: not UTF-8 text (byte 0)",
    ),
    "serve config file not UTF-8": (
        ["serve", "--config", "{bin}", "--port", "0"],
        "config file {bin} is not UTF-8 text (byte 0)",
    ),
    "serve replica URL with /v1": (
        ["serve", "--replica", "http://127.0.0.1:9/v1", "--port", "0"],
        "a replica URL must be http(s)://host[:port] without /v1 (the gateway adds /v1/...), "
        "got 'http://127.0.0.1:9/v1'",
    ),
    # From the CLI audit of 2026-12-07: a traceback, a public bind, or every request a 500.
    "serve broken IPv6 replica URL": (
        ["serve", "--replica", "http://[::1", "--port", "0"],
        "a replica URL must be http(s)://host[:port][/prefix], got 'http://[::1'",
    ),
    "serve empty host": (  # bound every interface
        ["serve", "--host", "", "--port", "0", "--emulate", "1"],
        "host and port: an address, and 0-65535: '':0",
    ),
    "serve block of 10**20 characters": (  # every request a 500
        ["serve", "--port", "0", "--emulate", "1", "--block-chars", "99999999999999999999"],
        "block size must be 1 to 1,048,576, got 99999999999999999999",
    ),
    "serve upstream key with a control character": (  # every request a 500
        ["serve", "--port", "0", "--emulate", "1", "--upstream-api-key-file", "{ctl}"],
        "the upstream api key file {ctl} holds a control character",
    ),
    "emulate KV-event port past 65535": (  # ZMQ bound it modulo 65536
        ["emulate", "--port", "0", "--kv-events-endpoint", "bind:tcp://127.0.0.1:99999"],
        "a ZMQ address's port must be 1-65535 (or *): 'tcp://127.0.0.1:99999' in "
        "'bind:tcp://127.0.0.1:99999'",
    ),
    "simulate empty plot name": (  # failed once the run was over
        ["simulate", "-w", "seed-conversation", "--plot", ""],
        "--plot '.': give a file name, not a folder",
    ),
    "bench empty URL": (  # ran emulated replicas instead
        ["bench", "--url", "", "-w", "seed-conversation"],
        "--url must be http(s)://host[:port], got ''",
    ),
    "simulate infinite overhead": (  # every request of the emulated replica hung
        ["simulate", "-w", "seed-conversation", "--fleet", "1:overhead_ms=inf"],
        "--fleet: overhead_ms needs a finite number, got 'inf'",
    ),
    # Each of these ran and failed later: every request (or the health loop), the engine, or
    # the simulation (a decode step of no time ended every conversation at its first turn).
    "serve NaN timeout": (
        ["serve", "--port", "0", "--emulate", "1", "--read-timeout", "nan"],
        "gateway settings must be positive and finite: read_timeout_s",
    ),
    "epp port past 65535": (  # gRPC bound it modulo 65536
        ["epp", "--endpoint", "127.0.0.1:9", "--grpc-port", "70000", "--http-port", "0"],
        "grpc_port out of range (0-65535): 70000",
    ),
    "epp one port twice": (  # "address already in use", with nothing else on it (2026-12-07)
        ["epp", "--endpoint", "127.0.0.1:9", "--grpc-port", "43951", "--http-port", "43951"],
        "grpc_port and http_port are both 43951: one each",
    ),
    "serve admin on its own port": (  # the same: the user gave one port twice
        ["serve", "--replica", "http://127.0.0.1:9", "--port", "43950", "--admin-port", "43950",
         "--admin-token-file", "{tok}"],
        "admin_port is port (43950) on one host: give it another",
    ),
    "simulate --plot under a file": (  # found only after the run, as "File exists"
        ["simulate", "-w", "seed-conversation", "--plot", "{bin}/x.png"],
        "--plot {bin}/x.png: {bin} is a file, not a folder",
    ),
    "emulate NaN time scale": (
        ["emulate", "--port", "0", "--time-scale", "nan"],
        "time scale must be positive and finite, got nan",
    ),
    "emulate NaN prefill rate": (
        ["emulate", "--port", "0", "--prefill-rate", "nan"],
        "prefill rate must be positive and decode step time non-negative, both finite: "
        "got nan and 0.015",
    ),
    "simulate decode step 0": (
        ["simulate", "-w", "seed-conversation", "--decode-step-ms", "0"],
        "the simulator needs a decode step above 0 s on every replica",
    ),
    "serve --emulate beside replicas": (  # --emulate was ignored without a word
        ["serve", "--port", "0", "--emulate", "2", "--replica", "http://127.0.0.1:9"],
        "--emulate starts replicas of its own: give it or replicas, not both",
    ),
    "simulate a policy twice": (  # it ran twice, reported twice under one name
        ["simulate", "-w", "seed-conversation", "-p", "round_robin,round_robin"],
        "a policy named twice in 'round_robin,round_robin': round_robin",
    ),
    "simulate NaN speed change": (
        ["simulate", "-w", "seed-conversation", "--speed-change", "r1@0:prefill=nan"],
        "a speed change's prefill rate must be positive and finite: nan",
    ),
    # An empty --fleet ran the default fleet without a word.
    "simulate empty fleet": (
        ["simulate", "-w", "seed-conversation", "--fleet", ""],
        "--fleet is empty; give groups like 2+2:prefill=2500",
    ),
    "serve health probes every 0.1 ms": (  # a probe loop that spun a CPU and the replicas
        ["serve", "--port", "0", "--emulate", "1", "--health-interval", "0.0001"],
        "health_interval_s must be at least 0.01 s, got 0.0001",
    ),
    "bench KV cache under a block": (  # a one-block cache that refused every request
        ["bench", "--emulate", "1", "--kv-tokens", "0"],
        "--kv-tokens must hold at least one KV block (1 tokens), got 0",
    ),
    "emulate empty fleet": (
        ["emulate", "--port", "0", "--fleet", ""],
        "--fleet is empty; give groups like 2+2:prefill=2500",
    ),
    # Counts with no bound: memory filled at 200 MB/s without a word, or as many ports bound.
    "simulate 1e8 replicas": (
        ["simulate", "-w", "seed-conversation", "--replicas", "100000000"],
        "--replicas must be 1 to 10,000, got 100,000,000",
    ),
    "simulate a fleet of 20,000": (
        ["simulate", "-w", "seed-conversation", "--fleet", "10000+10000:prefill=5000"],
        "--fleet describes more than 10,000 replicas",
    ),
    "serve 100,000 emulated replicas": (
        ["serve", "--port", "0", "--emulate", "100000"],
        "--emulate must be 1 to 1,000 replicas, got 100,000",
    ),
    "emulate 5,000 replicas": (
        ["emulate", "--port", "0", "--count", "5000"],
        "--count must be 1 to 1,000 replicas, got 5,000",
    ),
    "bench no emulated replica": (
        ["bench", "--emulate", "0"],
        "--emulate must be 1 to 1,000 replicas, got 0",
    ),
    # A cluster event that would do nothing ran as if it had not been asked for.
    "simulate adds a replica the fleet has": (
        ["simulate", "-w", "multi-turn", "-n", "8", "--set", "add_replica_at_s=5"],
        "multi-turn adds replica 'r4' at 5 s, which the fleet has then (name another)",
    ),
    "simulate removes a replica the fleet lacks": (
        ["simulate", "-w", "multi-turn", "--set", "remove_replica=r9",
         "--set", "remove_replica_at_s=5"],
        "multi-turn removes replica 'r9' at 5 s, which the fleet does not have then",
    ),
    "top polls every 1e308 s": (
        ["top", "--once", "--interval", "1e308"],
        "--interval must be at most 86,400 s, got 1e+308",
    ),
}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "0"], "--replicas must be 1 to 10,000, got 0"),
        # refused after both worked examples had printed (58 lines)
        (["--large", "nope"], "unknown workload 'nope'; valid: seed-conversation, "
         "seed-shared-prompt, multi-turn, shared-prefix, hot-prefix, no-sharing, mooncake, "
         "dialogues"),
    ],
)  # fmt: skip
def test_demo_refuses_bad_flags_before_it_prints_anything(argv: list[str], message: str) -> None:
    done = subprocess.run(
        [str(EXE), "demo", *argv], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"prefixroute: error: {message}"


@pytest.mark.parametrize("command", ["simulate", "demo", "bench"])
def test_a_negative_seed_is_one_line_and_exit_2(command: str) -> None:
    """numpy's generators take no negative seed: it was a traceback."""
    done = subprocess.run(
        [str(EXE), command, "--seed", "-1"], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert "Traceback" not in done.stderr and done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == f"prefixroute {command}: error: argument --seed: a seed is 0 or more, got -1"


@pytest.mark.parametrize("case", list(_BAD_INPUT))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe10.0.0.1:8000\n")
    ctl = tmp_path / "key"
    ctl.write_bytes(b"abcdefgh\x01ij\n")
    token = tmp_path / "token"
    token.write_text("an-admin-token\n")
    argv, message = _BAD_INPUT[case]
    done = subprocess.run(
        [str(EXE), *(a.format(bin=binary, ctl=ctl, tok=token) for a in argv)],
        capture_output=True, text=True, timeout=60, env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    assert "Traceback" not in done.stderr
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "prefixroute: error: " + message.format(
        bin=binary, ctl=ctl
    )


def test_a_full_disk_or_a_closed_pipe_is_no_traceback() -> None:
    # The CLI audit of 2026-12-07: hash-key into /dev/full, and simulate --json into a reader
    # that had closed its end, ended in tracebacks.
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full_disk:
            full = subprocess.run(
                [str(EXE), "hash-key", "--generate"], stdout=full_disk, stderr=subprocess.PIPE,
                text=True, timeout=60,
            )  # fmt: skip
        assert full.returncode == 2 and "Traceback" not in full.stderr
        message = "prefixroute: error: cannot write the output: No space left on device"
        assert full.stderr.strip() == message
    read, write = os.pipe()
    os.close(read)  # nobody reads
    closed = subprocess.run(
        [str(EXE), "simulate", "-w", "seed-conversation", "-p", "round_robin", "--json"],
        stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
    )  # fmt: skip
    os.close(write)
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
