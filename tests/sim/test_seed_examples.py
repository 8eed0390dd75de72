"""The article's worked examples, end to end through the ``simulate`` command's JSON."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY, ConfigError
from prefixroute.sim import compare_policies, make_workload, write_plot


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
        (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be a positive number"),
        (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be a positive number"),
        (["--plain", "1.5"], "--plain is a share between 0 and 1, got 1.5"),
        (["--plain", "nan"], "--plain is a share between 0 and 1, got nan"),
        (["-p", "round_robin,,predicted_ttft"], "an empty policy name"),
        (["-p", "cache_aware", "--policy-param", "cache_aware.cache_threshold=nan"], "finite"),
    ],
)
def test_bad_simulate_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--plot", "out.txt"], "--plot out.txt: matplotlib cannot write .txt files"),
        (["--kv-tokens", "10"], "request conv0/0 of seed-conversation needs 500 KV blocks"),
        (["--fleet", "1+2:kv_tokens=1000"], "needs 1150 KV blocks; replica r1 has 1000 "),
        (["--block-size", "1", "--fleet", "2:kv_tokens=1"], "replica r0 has 1 "),
    ],
)
def test_a_run_that_cannot_succeed_fails_before_it_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], needle: str
) -> None:
    """A plot format matplotlib lacks, or a request no replica's KV cache can ever hold: one
    line and exit 2 before the run (nothing on stdout), not a traceback after it or a table of
    NaN and zeros with exit 0."""
    with contextlib.chdir(tmp_path):
        assert main(["simulate", "-w", "seed-conversation", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not list(tmp_path.iterdir())
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_every_workload_is_checked_before_the_first_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With several workloads (``-w all``), a KV cache too small for a later one (multi-turn;
    seed-conversation, the first, fits 2,000 tokens) fails before the first is simulated."""

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("a workload ran before every one was checked")

    monkeypatch.setattr("prefixroute.commands.simulate.run_comparisons", no_run)
    assert main(["simulate", "-w", "all", "--kv-tokens", "2000", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "of multi-turn needs 134 KV blocks" in err and err.count("\n") == 1


def test_json_and_markdown_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "-w", "seed-conversation", "--json", "--markdown"])
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "not allowed with argument --json" in err


def test_a_plot_format_refused_at_save_time_is_one_line(tmp_path: Path) -> None:
    """``write_plot`` turns matplotlib's ValueError for a format into a ConfigError too (a
    caller that skipped ``check_plot_path``)."""
    cmp = compare_policies(make_workload("seed-conversation", 0), ["round_robin"], progress=False)
    with pytest.raises(ConfigError, match="cannot write plot .*plot.txt.*txt"):
        write_plot(cmp.metrics, cmp.ttfts_ms, tmp_path / "plot.txt", "title")


def test_a_plot_path_without_a_suffix_is_reported_as_the_png_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib adds ``.png`` to a path without a suffix: the report names that file."""
    plot = tmp_path / "plot"
    argv = ["simulate", "-w", "seed-conversation", "-p", "round_robin", "--plot", str(plot)]
    assert main(argv) == 0
    assert (tmp_path / "plot.png").is_file() and not plot.exists()
    assert f"plot written to {plot}.png" in capsys.readouterr().out.replace("\n", "")
