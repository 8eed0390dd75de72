"""A cached-token prediction judged against the replica's own count (``usage``).

One rule for every place that judges: the gateway's and picker's
``prefixroute_cache_predictions_total`` and the stale rate of ``simulate`` and ``bench``. Less
than one KV block apart is exact: a text key's blocks do not fall where the engine's do, and a
hit is capped at ``prompt - 1`` tokens, so a few tokens either way are the unit in which both
sides count, not staleness. Before 2026-12-03 any shortfall was "over" (a stale decision), and
44 of 48 such answers of a healthy bench run were 5 or 11 tokens short.
"""

from __future__ import annotations

from typing import Literal

Judgement = Literal["exact", "over", "under"]


def judge_prediction(predicted: int, actual: int, block: int) -> Judgement:
    """``exact``, ``over`` (a stale decision: the replica had a block or more less than
    predicted) or ``under``: ``predicted`` cached tokens against the replica's ``actual``,
    with KV blocks of ``block`` tokens."""
    if abs(predicted - actual) < block:
        return "exact"
    return "over" if predicted > actual else "under"
