"""``prefixroute top``: the fleet page in the terminal, read from a live gateway."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import aiohttp
import pytest
from rich.console import Console

from prefixroute.cli import main
from prefixroute.commands.top import fetch_state, render
from prefixroute.core import ConfigError
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.sim.replica import ReplicaConfig

TOKEN = "top-admin-token"
FAST_REPLICA = EmulatorConfig(ReplicaConfig(block_size=1), time_scale=0.01)


@contextlib.asynccontextmanager
async def fleet_with_traffic(tmp_path: Path) -> AsyncIterator[tuple[Gateway, Path, list[str]]]:
    """Two emulated replicas behind a gateway with an admin token, after 4 requests."""
    cluster = await start_replicas(2, FAST_REPLICA)
    config = GatewayConfig(port=0, replicas=tuple(cluster.urls), admin_token=TOKEN)
    try:
        async with Gateway(config) as gw:
            async with aiohttp.ClientSession() as session:
                for i in range(4):
                    text = "same prefix " * 20 + str(i)
                    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
                    async with session.post(gw.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200
            token_file = tmp_path / "token"
            token_file.write_text(TOKEN + "\n")
            yield gw, token_file, cluster.urls
    finally:
        await cluster.stop()


def run_cli(args: list[str]) -> Awaitable[int]:
    """``main(args)`` in a thread: it blocks, and the gateway lives on this test's loop."""
    return asyncio.to_thread(main, args)


async def test_once_prints_every_replica_and_the_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    async with fleet_with_traffic(tmp_path) as (gw, token_file, urls):
        args = ["top", "--once", "--url", gw.url, "--admin-token-file", str(token_file)]
        code = await run_cli(args)
    out = capsys.readouterr().out
    assert code == 0
    assert "4 requests" in out and "prefix_match" in out and "least_loaded" in out
    for url in urls:
        assert url.partition("://")[2] in out
    assert max(len(line) for line in out.splitlines()) <= 100  # fits an SSH terminal


async def test_once_into_a_pipe_keeps_every_replica_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/dashboard.md: ``--once`` is a snapshot for scripts. Written to a pipe (no terminal,
    no $COLUMNS) it was cut at 80 columns, every replica shown as ``127.…``."""
    monkeypatch.delenv("COLUMNS", raising=False)
    async with fleet_with_traffic(tmp_path) as (gw, token_file, urls):
        args = ["top", "--once", "--url", gw.url, "--admin-token-file", str(token_file)]
        assert await run_cli(args) == 0
    out = capsys.readouterr().out
    for url in urls:
        assert url.partition("://")[2] in out
    assert "…" not in out


async def test_token_from_the_environment_and_its_absence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with fleet_with_traffic(tmp_path) as (gw, _, _):
        monkeypatch.delenv("PREFIXROUTE_ADMIN_TOKEN", raising=False)
        assert await run_cli(["top", "--once", "--url", gw.url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "wants a valid admin token" in err
        monkeypatch.setenv("PREFIXROUTE_ADMIN_TOKEN", TOKEN)
        assert await run_cli(["top", "--once", "--url", gw.url]) == 0
        assert "prefix_match" in capsys.readouterr().out


def test_unreachable_gateway_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["top", "--once", "--url", f"http://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixroute: error: cannot reach the gateway") and err.count("\n") == 1


def test_missing_token_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--once", "--admin-token-file", str(tmp_path / "nope")]) == 2
    assert "cannot read the admin token file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfetoken\n", "is not UTF-8 text"),
        (b"one\ntwo\n", "holds more than one line"),
        (b"\n", "is empty"),
    ],
)
def test_a_bad_token_file_is_one_line_as_for_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    """``top`` reads the token file as ``serve`` does: not UTF-8, or several lines (which no
    Authorization header can carry), is one line of error, not a traceback or a bad header."""
    path = tmp_path / "token"
    path.write_bytes(content)
    assert main(["top", "--once", "--admin-token-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"prefixroute: error: the admin token file {path} {message}\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "notaurl"], "--url must be http(s)://host[:port]"),
        (["--url", "ftp://127.0.0.1:21"], "--url must be http(s)://host[:port]"),
        (["--url", "http://127.0.0.1:99999"], "--url has a bad port"),
        (["--timeout", "0"], "--timeout must be a positive number"),
        (["--timeout", "-1"], "--timeout must be a positive number"),
        (["--timeout", "nan"], "--timeout must be a positive number"),
        (["--decisions", "-3"], "--decisions must be 0 or more"),
        # time.sleep and socket timeouts overflow: a traceback, where the rule is one line
        (["--timeout", "1e308"], "--timeout must be at most 86,400 s"),
        (["--interval", "1e308"], "--interval must be at most 86,400 s"),
    ],
)
def test_bad_flags_are_one_line_before_any_poll(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    def no_poll(*args: object) -> None:
        raise AssertionError("polled the gateway before checking the flags")

    monkeypatch.setattr("prefixroute.commands.top.fetch_state", no_poll)
    assert main(["top", "--once", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"prefixroute: error: {message}") and err.count("\n") == 1, err


def test_rates_come_from_two_snapshots() -> None:
    def state(t: float, requests: int) -> dict[str, object]:
        replica = {
            "id": "http://10.0.0.1:8000", "name": "r-1", "status": "healthy", "in_flight": 1,
            "queued_prefill_tokens": 0, "queued_prefill_s": 0.0, "index_blocks": 3,
            "requests": requests, "prompt_tokens": 100, "predicted_cached": 50,
            "actual_cached": 40,
            "speed": {"prefill_tokens_per_s": 10000.0, "decode_step_s": 0.015},
        }  # fmt: skip
        totals = {"requests": requests, "in_flight": 1, "prompt_tokens": 100,
                  "predicted_cached": 50, "actual_cached": 40, "index_entries": 3}  # fmt: skip
        return {"time": t, "policy": "p", "mode": "approximate", "totals": totals,
                "replicas": [replica], "decisions": []}  # fmt: skip

    console = Console(width=100, record=True)
    console.print(render(state(12.0, 30), state(10.0, 10)))
    text = console.export_text()
    assert " 10.0 " in text  # (30 - 10) requests / 2 s
    assert "50.0" in text and "40.0" in text  # hit rates predicted / reported, percent
    assert "10,000 " in text and "10,000*" not in text  # no estimates_from: learned
    cold = state(12.0, 30)
    replica = cold["replicas"][0]  # type: ignore[index]
    replica["speed"]["estimates_from"] = "fleet"
    console = Console(width=100, record=True)
    console.print(render(cold, None))
    assert "10,000*" in console.export_text()


def test_fetch_state_of_nothing_is_a_config_error() -> None:
    # Nothing listens on port 9 of loopback: a one-line ConfigError, not a urllib traceback.
    with pytest.raises(ConfigError, match="cannot reach"):
        fetch_state("http://127.0.0.1:9", None, 1.0)


async def test_live_into_a_pipe_prints_a_frame_per_poll_and_ends_with_its_reader(
    tmp_path: Path,
) -> None:
    """Without a terminal (a file, a pipe, ``top | head``) rich's ``Live`` drew nothing until
    it stopped, so ``top | head`` printed nothing and never ended. Now each poll prints a frame
    at once, and when the reader has seen enough, top ends (0) without a traceback."""
    async with fleet_with_traffic(tmp_path) as (gw, token_file, urls):
        command = (
            f"set -o pipefail; {sys.executable} -m prefixroute.cli top --url {gw.url} "
            f"--admin-token-file {token_file} --interval 0.1 | head -n 40"
        )
        # No $COLUMNS (a pipe's frame is as wide as its table), whatever the test run has set.
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, env=env,  # its own group: stopped with it below, if hung
        )
        try:
            async with asyncio.timeout(60):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:  # it hung (the defect): nothing left running
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert not err, err.decode()
    assert text.count(urls[0].partition("://")[2]) >= 2  # more than one frame came


async def test_a_replica_s_url_is_told_apart_from_a_gateway_s() -> None:
    """``top --url`` at a replica, or at a path, was told it needed an admin token or a
    loopback address, though it had both (an outside review, 2026-12-07): the 404 now says to
    point --url at a gateway's base URL."""
    cluster = await start_replicas(1, FAST_REPLICA)
    try:
        with pytest.raises(ConfigError, match="prefixroute gateway's base URL") as caught:
            await asyncio.to_thread(fetch_state, cluster.urls[0], None, 5.0)
        assert "not a replica" in str(caught.value)
    finally:
        await cluster.stop()
