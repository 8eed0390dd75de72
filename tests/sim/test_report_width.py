"""Reports fit the terminal (issue 14: "tables fit 100 columns, with folding below that";
"make demo fits an 80-column terminal without truncated numbers")."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from prefixroute.sim import (
    PolicyMetrics,
    ReplicaConfig,
    compare_policies,
    make_workload,
    print_report,
)


def report_metrics() -> list[PolicyMetrics]:
    workload = make_workload("seed-conversation", 0)
    cmp = compare_policies(
        workload, ["round_robin", "predicted_ttft"], replicas=5,
        replica_config=ReplicaConfig(block_size=workload.block_size), progress=False,
    )  # fmt: skip
    return cmp.metrics


def report(width: int) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    print_report(report_metrics(), "seed-conversation", console)
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


def test_requests_a_replica_refused_are_said_under_the_table() -> None:
    """The simulator counts a request too large for its replica's KV cache failed and goes
    on; the summary table cannot show that (NaN, zeros), so the report says it in a line."""
    workload = make_workload("seed-conversation", 0)
    small = ReplicaConfig(kv_capacity_blocks=1_000, block_size=1)  # turn 3 needs more
    cmp = compare_policies(workload, ["round_robin"], replica_config=small, progress=False)
    out = io.StringIO()
    print_report(cmp.metrics, "seed-conversation", Console(file=out, width=200))
    assert "round_robin: 1 of 3 requests failed" in out.getvalue()  # 4, 5 never sent
    out = io.StringIO()
    print_report(report_metrics(), "seed-conversation", Console(file=out, width=200))
    assert "failed" not in out.getvalue()  # none failed: no line
