"""``prefixroute bench`` end to end: emulated replicas behind the gateway, and a --url run."""

from __future__ import annotations

import dataclasses
import json
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from gateway.fakes import ClosingReplica, FakeReplica

from prefixroute._pool import upstream_connector
from prefixroute.bench import ReplayConfig, ReplayResult, prompt_text, replay
from prefixroute.bench._client import stream_completion
from prefixroute.cli import main
from prefixroute.commands.bench import _metrics, _print
from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.sim import Workload, oracle_floor
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload


def test_emulated_comparison_reproduces_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "-w",
            "seed-conversation",
            "-n",
            "5",
            "--block-size",
            "1",
            "--time-scale",
            "0.05",
            "-p",
            f"round_robin,{DEFAULT_POLICY}",
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    by = {p["policy"]: p for p in doc["policies"]}
    # Counted from the replicas' own usage.prompt_tokens_details.cached_tokens.
    assert by["round_robin"]["prefill_tokens"] == 5_200
    assert by[DEFAULT_POLICY]["prefill_tokens"] == 1_700
    assert len(by["round_robin"]["per_replica_requests"]) == 5
    # Every replica is listed, in the fleet's order, those sent nothing with 0.
    served = by[DEFAULT_POLICY]["per_replica_requests"]
    assert list(served) == ["r0", "r1", "r2", "r3", "r4"]
    assert sorted(served.values()) == [0, 0, 0, 0, 5]
    assert by[DEFAULT_POLICY]["errors"] == 0
    assert by[DEFAULT_POLICY]["itl_ms"]["p50"] > 0


def test_staleness_is_judged_in_the_replicas_blocks(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/simulator.md: ``stale_rate`` counts as the gateway's cache predictions count
    ``over``, a KV block or more fewer found than predicted. Judged in the workload's block of
    1 token, predictions a few tokens off within the replicas' 16-token blocks read as stale
    (0.6 where the gateway counted none)."""
    argv = ["bench", "-w", "seed-conversation", "-p", DEFAULT_POLICY, "--block-size", "16",
            "--time-scale", "0.05", "--json"]  # fmt: skip
    assert main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)["policies"]
    assert row["predicted_cached_tokens"] > 0  # it did predict: there is something to judge
    assert row["stale_rate"] == 0.0


def test_no_x_floor_when_requests_failed(capsys: pytest.CaptureFixture[str]) -> None:
    """The floor counts every request of the workload, the prefill only those served: with a
    turn refused (a prompt over the replicas' 1,100-token caches), and the conversation stopped
    there, x floor read below 1, which the floor's definition rules out. It is left out."""
    argv = ["bench", "-w", "seed-conversation", "--block-size", "1", "--kv-tokens", "1100",
            "-p", "round_robin", "--time-scale", "0.05", "--json"]  # fmt: skip
    assert main(argv) == 1  # requests failed
    [row] = json.loads(capsys.readouterr().out)["policies"]
    assert row["errors"] >= 1 and row["prefill_tokens"] > 0
    assert row["floor_ratio"] is None


def test_fleet_gives_the_emulated_replicas_their_own_speeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--fleet as in simulate: the fleet's size replaces --emulate, each replica runs at its own
    prefill rate, and the report names replicas r0, r1 in the fleet's order."""
    code = main([
        "bench", "-w", "seed-conversation", "-n", "4", "--block-size", "1",
        "--time-scale", "0.2", "-p", "round_robin", "--json",
        "--fleet", "1:prefill=200000+1:prefill=2000",
    ])  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert "r1: 2,000 tok/s" in doc["target"]
    row = doc["policies"][0]
    assert list(row["per_replica_requests"]) == ["r0", "r1"]  # 2 replicas, not -n 4
    ttft: dict[str, list[float]] = {"r0": [], "r1": []}
    for turn in row["turns"]:
        ttft[turn["replica"]].append(turn["ttft_ms"])
    # Round robin alternates turns; a turn prefills >= 300 new tokens: >= 150 ms at 2,000
    # tokens/s, a few ms at 200,000.
    assert ttft["r0"] and ttft["r1"]
    assert min(ttft["r1"]) > 150 and min(ttft["r1"]) > 2 * max(ttft["r0"])


def test_fleet_is_for_emulated_replicas_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--url", "http://127.0.0.1:1", "--fleet", "2+2"]) == 2
    assert "omit --url" in capsys.readouterr().err
    assert main(["bench", "--fleet", "2+x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixroute: error: --fleet") and err.count("\n") == 1


def test_prompt_text_is_one_word_per_token_and_turns_extend() -> None:
    w = make_workload("seed-conversation")
    texts = [prompt_text(t) for t in w.sessions[0].turns]
    assert [len(t.split()) for t in texts] == [400, 700, 1000, 1400, 1700]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


async def test_replay_against_one_replica_directly() -> None:
    # Arrivals 50 ms apart in real time (1 s scaled by 0.05), each well after the one before has
    # prefilled (about 1 ms): at the workload's own 0.5 ms a busy machine let two prefill in one
    # step, and neither found the other's prompt (CI, 800 cached instead of 1,000).
    w = make_workload("seed-shared-prompt", overrides={"users": "6", "interval_s": "1.0"})
    cluster = await start_replicas(1, EmulatorConfig(ReplicaConfig(block_size=1), time_scale=0.05))
    try:
        result = await replay(w, ReplayConfig(cluster.urls[0], time_scale=0.05), "direct")
    finally:
        await cluster.stop()
    assert result.errors == []
    recs = result.run.records
    assert len(recs) == 6 and all(r.first_token_s is not None for r in recs)
    assert sum(r.cached_tokens for r in recs) == 5 * 200  # one replica: everyone after the first


def test_unreachable_url_is_one_line_not_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    """A dead --url fails at once with one line naming it, not a table of nan (issue 14)."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(
        [
            "bench",
            "--url",
            f"http://127.0.0.1:{port}",
            "-w",
            "seed-conversation",
            "--time-scale",
            "0.01",
        ]
    )
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"prefixroute: error: cannot reach http://127.0.0.1:{port}")
    assert err.count("\n") == 1 and "nan" not in err


def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--time-scale", "0"]) == 2
    assert "time-scale" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--timeout", "0"], "--timeout must be a positive number, got 0"),
        (["--timeout", "-1"], "--timeout must be a positive number, got -1"),
        (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be a positive number"),
        (["--plot", "b.txt"], "--plot b.txt: matplotlib cannot write .txt files"),
        (["--url", "ftp://127.0.0.1:9"], "--url must be http(s)://host[:port]"),
        (["--url", "http://127.0.0.1:9", "--plot", "b.txt"], "--plot b.txt: matplotlib cannot"),
        (["-p", "round_robin,,cache_aware"], "an empty policy name"),
    ],
)
def test_flags_that_cannot_work_fail_before_any_replay(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """A timeout no request can meet, or a plot format matplotlib lacks (found only after
    the whole replay before): one line and exit 2, before anything is started or sent."""

    def no_replay(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed before checking the flags")

    monkeypatch.setattr("prefixroute.commands.bench.replay", no_replay)
    assert main(["bench", "-w", "seed-conversation", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"prefixroute: error: {message}"), err
    assert err.count("\n") == 1


async def test_a_connection_the_server_closed_is_no_error_of_the_server_s() -> None:
    """A server closes a keep-alive connection idle past its timeout (vLLM's: 5 s); a request
    the load generator wrote on it just then was never read. ``ClosingReplica`` closes every
    connection, unanswered, at its second POST: each request after the first met such a
    connection, and was reported as the server's error (ServerDisconnectedError) before it was
    resent."""
    replica = ClosingReplica()
    await replica.start()
    try:
        async with aiohttp.ClientSession(connector=upstream_connector()) as session:
            outcomes = [await stream_completion(session, replica.url + "/v1/completions",
                                                {"prompt": "a", "stream": True})
                        for _ in range(4)]  # fmt: skip
    finally:
        await replica.stop()
    assert [(o.status, o.error) for o in outcomes] == [(200, None)] * 4
    assert replica.posts == 4 + 3


async def _two_tokens_a_word(request: web.Request) -> web.StreamResponse:
    """A replica whose tokenizer splits each of the workload's words in two, caching nothing;
    the prompt "silent" gets no cached-token count (SGLang without --enable-cache-report)."""
    prompt = (await request.json())["prompt"]
    usage: dict[str, Any] = {"prompt_tokens": 2 * len(prompt.split()), "completion_tokens": 1}
    if prompt != "silent":
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(b'data: {"choices":[{"text":"x"}]}\n\n')
    await out.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    await out.write(b"data: [DONE]\n\n")
    return out


async def _replay_on_two_tokens_a_word(w: Workload, label: str) -> ReplayResult:
    """``w`` replayed 100x faster against one replica serving ``_two_tokens_a_word``."""
    fake = FakeReplica(handler=_two_tokens_a_word)
    await fake.start()
    try:
        return await replay(w, ReplayConfig(fake.url, time_scale=0.01), label)
    finally:
        await fake.stop()


async def test_the_floor_is_put_in_the_replicas_tokens() -> None:
    """Prefill is counted in the replica's tokens (its usage), the floor in the workload's: a
    real tokenizer (or a replica written by others) splits the workload's words otherwise, and
    against the unscaled floor every policy looked twice as wasteful as it was."""
    w = make_workload("seed-conversation")
    result = await _replay_on_two_tokens_a_word(w, "two")
    assert result.errors == [] and result.token_scale == 2.0
    floor = oracle_floor(w, w.block_size)
    m = _metrics(result, floor, 1.0)
    assert m.oracle_floor == 2 * floor
    prompt = sum(len(t.tokens) for s in w.sessions for t in s.turns)
    assert m.floor_ratio == pytest.approx(2 * prompt / (2 * floor))  # nothing cached


async def test_hits_are_said_unmeasured_when_no_answer_reports_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    w = make_workload("seed-conversation")
    silenced = [  # every prompt "silent": usage without cached tokens
        dataclasses.replace(s, turns=[dataclasses.replace(t, text="silent") for t in s.turns])
        for s in w.sessions
    ]
    w = dataclasses.replace(w, sessions=silenced)
    silent = await _replay_on_two_tokens_a_word(w, "silent")
    assert silent.errors == [] and silent.cached_reported == 0
    _print([_metrics(silent, 1000, 1.0)], [silent], "t")
    assert "silent: no answer reported its cached tokens" in capsys.readouterr().out
