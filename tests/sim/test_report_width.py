"""Reports fit the terminal (issue 14: "tables fit 100 columns, with folding below that";
"make demo fits an 80-column terminal without truncated numbers")."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from prefixroute.sim import ReplicaConfig, compare_policies, make_workload, print_report


def report(width: int) -> list[str]:
    workload = make_workload("seed-conversation", 0)
    cmp = compare_policies(
        workload, ["round_robin", "predicted_ttft"], replicas=5,
        replica_config=ReplicaConfig(block_size=workload.block_size), progress=False,
    )  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    print_report(cmp.metrics, "seed-conversation", console)
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100])
def test_a_narrow_terminal_gets_every_number_within_its_width(width: int) -> None:
    lines = report(width)
    assert max(len(line) for line in lines) <= width
    text = "\n".join(lines)
    assert "…" not in text  # nothing cut behind an ellipsis
    for number in ("5,200", "1,700", "3,500", "3.06", "67.3", "2308", "2235"):
        assert number in text, number  # every figure whole, on one line
    assert "round_robin " in text and "predicted_ttft " in text  # policy names whole


def test_a_wide_terminal_gets_the_summary_as_one_table() -> None:
    lines = report(240)
    headers = [line for line in lines if "policy" in line and "TTFT p50" in line]
    assert len(headers) == 1 and "prefill tok" in headers[0]  # work and latency side by side
    narrow = report(80)
    assert not any("policy" in line and "TTFT p50" in line and "prefill" in line for line in narrow)
