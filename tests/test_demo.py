"""``prefixroute demo`` (what ``make demo`` runs), as a newcomer runs it: its key numbers, exactly.

The numbers are the article's (``../shared/seed/DIGEST.md``): the five-turn conversation costs
5,200 prompt tokens under round robin and 1,700 when it stays with its cache (520 ms against
170 ms of time to first token at 10,000 tokens/s); 50 users sharing a 200-token system prompt
on 5 replicas save 45 x 200 = 9,000 tokens with 10 users per replica.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_demo_prints_the_articles_numbers_and_writes_its_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    exe = Path(sys.executable).with_name("prefixroute")
    env = dict(os.environ, COLUMNS="240", NO_COLOR="1")
    done = subprocess.run(
        [str(exe), "demo", "--plot", str(plot)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())  # rich may wrap long lines
    assert (
        "=> 5,200 vs 1,700 prompt tokens computed (67% less); whole conversation 520 ms vs "
        "170 ms of time to first token." in out
    )
    assert (
        "=> predicted_ttft: 9,000 tokens reused, requests per replica [10, 10, 10, 10, 10]." in out
    )
    assert "multi-turn: 2,505 requests, 5 replicas" in out
    assert f"plot written to {plot}" in out
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # The closing hint repeats the command as it was run: `make demo` runs the venv's script,
    # which a newcomer does not have on PATH.
    assert f"Next: `{exe} simulate --list`" in out
    told = "Prefill runs at 10,000 tokens/s, so 1,700 tokens cost 170 ms and 300 new tokens 30 ms"
    assert told in out


def test_the_narration_follows_the_prefill_rate_given(tmp_path: Path) -> None:
    """It said 10,000 tokens/s and 170 ms whatever --prefill-rate was, above a table that
    showed 85 ms (an outside review, 2026-12-07)."""
    exe = Path(sys.executable).with_name("prefixroute")
    done = subprocess.run(
        [str(exe), "demo", "--prefill-rate", "20000", "--large", "seed-conversation",
         "--plot", str(tmp_path / "d.png")],
        cwd=tmp_path, env=dict(os.environ, COLUMNS="240", NO_COLOR="1"), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    told = "Prefill runs at 20,000 tokens/s, so 1,700 tokens cost 85 ms and 300 new tokens 15 ms"
    assert told in out


def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_demo_runs(
    tmp_path: Path,
) -> None:
    """It was refused once the whole demo had run (about 5 s), after its report."""
    exe = Path(sys.executable).with_name("prefixroute")
    done = subprocess.run(
        [str(exe), "demo", "--plot", str(tmp_path / "d.txt")],
        cwd=tmp_path, env=dict(os.environ, NO_COLOR="1"), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""  # nothing of the demo printed
    assert "matplotlib cannot write .txt files" in done.stderr.strip().splitlines()[-1]


def runs_of(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The keyword arguments of each ``compare_policies`` call the demo makes, in order (the
    calls still run)."""
    from prefixroute.commands import demo

    calls: list[dict[str, object]] = []
    real = demo.compare_policies

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(demo, "compare_policies", spy)
    monkeypatch.setenv("NO_COLOR", "1")
    return calls


def test_the_seed_reaches_routing_as_in_simulate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--seed``: "seed for workloads and routing". Routing ran at seed 0 whatever it said, so
    ``demo --seed 1`` differed from ``simulate --seed 1`` on the same workload."""
    from prefixroute.cli import main

    runs = runs_of(monkeypatch)
    plot = str(tmp_path / "d.png")
    argv = ["demo", "--seed", "3", "--large", "seed-conversation", "--plot", plot]
    assert main(argv) == 0
    assert [run.get("seed", 0) for run in runs] == [3, 3, 3]


def test_block_size_reaches_the_large_run_and_a_bad_one_is_refused_before_the_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--block-size`` ("KV block size, tokens (default: workload's)") was taken and ignored:
    every run kept its workload's. It is the large run's; the worked examples stay token-exact."""
    from prefixroute.cli import main

    runs = runs_of(monkeypatch)
    plot = str(tmp_path / "d.png")
    argv = ["demo", "--block-size", "4", "--large", "seed-conversation", "--plot", plot]
    assert main(argv) == 0
    assert [run["replica_config"].block_size for run in runs] == [1, 1, 4]  # type: ignore[attr-defined]
    assert "block 4" in capsys.readouterr().out
    assert main(["demo", "--block-size", "0", "--plot", plot]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--block-size must be at least 1" in captured.err
    assert main(["demo", "--block-size", "10000000", "--plot", plot]) == 2  # over --kv-tokens
    captured = capsys.readouterr()
    assert captured.out == "" and "--kv-tokens must hold at least one block" in captured.err
