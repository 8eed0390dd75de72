"""How a live run's records are scored (sim/metrics.py ``summarize``).

From the docs: a stale prediction is one that found at least one KV block fewer cached tokens
than predicted (less than a block apart is the unit either side counts in); a plain answer in
a live run shows no first token, so it counts in prefill but not in TTFT or the SLO
(bench/_replay.py).
"""

from __future__ import annotations

import pytest

from prefixroute.sim import RequestRecord, RunResult, summarize


def record(
    i: int, predicted: int, cached: int, ttft: float | None, plain: bool = False
) -> RequestRecord:
    rec = RequestRecord(f"s{i}/0", f"s{i}", 0, float(i), 100, 10)
    rec.predicted_cached_tokens, rec.cached_tokens, rec.plain = predicted, cached, plain
    rec.first_token_s = None if ttft is None else rec.arrival_s + ttft
    rec.finish_s = rec.arrival_s + 2.0
    return rec


def run(records: list[RequestRecord]) -> RunResult:
    return RunResult("p", "w", 16, 10.0, records, [], None, None, 0, 0.0, live=True)


def test_stale_means_a_block_or_more_fewer_than_predicted() -> None:
    recs = [
        record(0, 64, 64, 0.1),
        record(1, 64, 49, 0.1),  # 15 tokens short: the unit, not staleness
        record(2, 64, 48, 0.1),  # a block short: stale
        record(3, 0, 32, 0.1),  # more than predicted: not stale
    ]
    assert summarize(run(recs), None).stale_rate == pytest.approx(1 / 4)


def test_a_plain_answer_counts_in_prefill_not_in_ttft_or_the_slo() -> None:
    recs = [
        record(0, 0, 0, 0.5),
        record(1, 0, 20, 2.0),  # streamed, past the 1 s SLO
        record(2, 0, 40, None, plain=True),  # its first token unseen
    ]
    m = summarize(run(recs), 300, ttft_slo_s=1.0)
    assert m.prefill_tokens == 300 - 60 and m.cached_tokens == 60
    assert m.completed == 3
    assert m.ttft_ms["p50"] == pytest.approx(1250.0)
    assert m.slo_attainment == pytest.approx(1 / 2)  # of the two streamed
    assert m.goodput_rps == pytest.approx(1 / 10.0)
