"""``prefixroute bench`` end to end: emulated replicas behind the gateway, and a --url run."""

from __future__ import annotations

import json
import socket

import pytest

from prefixroute.bench import ReplayConfig, prompt_text, replay
from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload


def test_emulated_comparison_reproduces_the_article(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "bench", "-w", "seed-conversation", "-n", "5", "--block-size", "1",
        "--time-scale", "0.05", "-p", f"round_robin,{DEFAULT_POLICY}", "--json",
    ])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    by = {p["policy"]: p for p in doc["policies"]}
    # Counted from the replicas' own usage.prompt_tokens_details.cached_tokens.
    assert by["round_robin"]["prefill_tokens"] == 5_200
    assert by[DEFAULT_POLICY]["prefill_tokens"] == 1_700
    assert len(by["round_robin"]["per_replica_requests"]) == 5
    assert list(by[DEFAULT_POLICY]["per_replica_requests"].values()) == [5]
    assert by[DEFAULT_POLICY]["errors"] == 0
    assert by[DEFAULT_POLICY]["itl_ms"]["p50"] > 0


def test_prompt_text_is_one_word_per_token_and_turns_extend() -> None:
    w = make_workload("seed-conversation")
    texts = [prompt_text(t) for t in w.sessions[0].turns]
    assert [len(t.split()) for t in texts] == [400, 700, 1000, 1400, 1700]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))


async def test_replay_against_one_replica_directly() -> None:
    w = make_workload("seed-shared-prompt", overrides={"users": "6"})
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
    code = main([
        "bench", "--url", f"http://127.0.0.1:{port}", "-w", "seed-conversation",
        "--time-scale", "0.01",
    ])
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"prefixroute: error: cannot reach http://127.0.0.1:{port}")
    assert err.count("\n") == 1 and "nan" not in err


def test_bad_flags_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--time-scale", "0"]) == 2
    assert "time-scale" in capsys.readouterr().err
