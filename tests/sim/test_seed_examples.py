"""The article's worked examples, end to end through the ``simulate`` command's JSON."""

from __future__ import annotations

import json

import pytest

from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY


def simulate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict]:  # type: ignore[type-arg]
    assert main(["simulate", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {p["policy"]: p for p in doc["policies"]}


def test_conversation_round_robin_vs_default(capsys: pytest.CaptureFixture[str]) -> None:
    out = simulate_json(
        capsys, "--workload", "seed-conversation", "--replicas", "5",
        "--policy", f"round_robin,{DEFAULT_POLICY}",
    )
    rr, ours = out["round_robin"], out[DEFAULT_POLICY]
    assert rr["prefill_tokens"] == 5_200 and rr["cached_tokens"] == 0
    assert ours["prefill_tokens"] == 1_700 and ours["cached_tokens"] == 3_500
    assert ours["oracle_floor"] == 1_700
    assert [t["computed_tokens"] for t in ours["turns"]] == [400, 300, 300, 400, 300]
    assert [t["cached_tokens"] for t in ours["turns"]] == [0, 400, 700, 1_000, 1_400]
    # 10,000 prefill tokens/s: turn 5 takes 170 ms vs 30 ms; the conversation 520 vs 170 ms.
    assert rr["turns"][4]["ttft_ms"] == pytest.approx(170.0)
    assert ours["turns"][4]["ttft_ms"] == pytest.approx(30.0)
    assert rr["ttft_total_ms"] == pytest.approx(520.0)
    assert ours["ttft_total_ms"] == pytest.approx(170.0)
    assert sorted(rr["per_replica_requests"].values()) == [1, 1, 1, 1, 1]
    assert sorted(ours["per_replica_requests"].values()) == [0, 0, 0, 0, 5]
    # The router predicted exactly what the replica found.
    assert ours["predicted_cached_tokens"] == ours["cached_tokens"]


def test_conversation_block_granular(capsys: pytest.CaptureFixture[str]) -> None:
    out = simulate_json(
        capsys, "--workload", "seed-conversation", "--replicas", "5",
        "--policy", DEFAULT_POLICY, "--block-size", "16",
    )
    turns = out[DEFAULT_POLICY]["turns"]
    # With 16-token blocks, turn 3 reuses 688 of turn 2's 700 tokens.
    assert [t["cached_tokens"] for t in turns] == [0, 400, 688, 992, 1_392]


def test_shared_prompt_saves_9000_tokens_with_10_users_per_replica(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = simulate_json(
        capsys, "--workload", "seed-shared-prompt", "--replicas", "5",
        "--policy", f"round_robin,least_loaded,{DEFAULT_POLICY}",
    )
    # The article's numbers (../shared/seed/DIGEST.md), exactly, for the default policy too:
    # it spreads the users as the others do, and saves what the article says.
    for policy in ("round_robin", "least_loaded", DEFAULT_POLICY):
        m = out[policy]
        assert list(m["per_replica_requests"].values()) == [10, 10, 10, 10, 10]
        assert m["cached_tokens"] == 9_000  # 45 requests x 200 shared tokens
    # README: TTFT p99 25 ms under round_robin, 35 ms under the other two (5 ms steps).
    p99 = {policy: round(m["ttft_ms"]["p99"], 6) for policy, m in out.items()}
    assert p99 == {"round_robin": 25.0, "least_loaded": 35.0, DEFAULT_POLICY: 35.0}


def test_unknown_policy_and_workload_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", "--policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown policy 'nope'" in err and "round_robin" in err and err[-1] == "\n"
    assert main(["simulate", "--workload", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["simulate", "--workload", "multi-turn", "--set", "bogus=1"]) == 2
    assert "bogus" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--block-size", "0"], "--block-size"),
        (["--replicas", "0"], "--replicas"),
        (["--policy-param", "cache_aware.cache_threshold=0.5"], "does not run"),
        (["-p", "cache_aware", "--policy-param", "cache_aware.nope=1"], "no parameter nope"),
        (["-p", "cache_aware", "--policy-param", "cache_aware.cache_threshold=x"], "bad"),
        (["-w", "seed-conversation", "--plot", "/proc/no/such.png"], "cannot write plot"),
    ],
)
def test_bad_simulate_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
