"""A replica's learned speed as reports show it (the admin API, the dashboard, ``top``,
``/metrics``): its estimates beside the evidence they rest on.

**How good the predictions are.** Before a first token teaches the model, the model predicts it
from the estimates of the moment: past the warm-up, ``predicted / measured`` goes into a window
per replica, whose median error is reported (:meth:`ReplicaSpeed.snapshot`), from the request's
real uncached tokens when reported: the speed model's error alone.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from prefixroute.core.context_cost import doubling_context, effective_rate
from prefixroute.core.speed_fit import _context_per_token as context_per_token

if TYPE_CHECKING:  # the speed model imports this module
    from prefixroute.core.speed import ReplicaSpeed


def snapshot(speed: ReplicaSpeed, given: bool = False) -> dict[str, float | int | str | None]:
    """``speed``'s estimates and their evidence: ``ttft_error_p50`` is the median
    ``|predicted / measured - 1|`` of the last ``window`` TTFTs predicted past the warm-up,
    ``ttft_ratio_p50`` the median ratio (above 1: too long); None before any.
    ``whole_observations``: plain answers, which arrive whole and teach prefill and decode in
    one observation (they are in ``prefill_observations`` too). ``given``: its priors are its
    own, given for this replica (``SpeedPrior``), not the fleet's; until it has learned, its
    estimates then say "given" where they would say "prior"."""
    ratios = speed.ttft_ratios()
    return {
        "prefill_tokens_per_s": speed.prefill_tokens_per_s,
        "decode_step_s": speed.decode_step_s,
        "first_token_overhead_s": speed.first_token_overhead_s,
        "engine_overhead_s": speed.engine_overhead_s,
        # Attention (core/context_cost.py): seconds per token per 1k tokens of context, and the
        # context at which a token costs double (None: the cost does not grow with it).
        "attention_s": speed.attention_s,
        "attention_tokens": doubling_context(speed.prefill_tokens_per_s, speed.attention_s),
        # The rate with attention at this replica's typical context (its first tokens'): the
        # fit's split between the two is loose where prompts are mostly cached, their sum is not.
        "effective_prefill_tokens_per_s": effective_prefill_rate(speed),
        "prefill_observations": speed.prefill_observations,
        "decode_observations": speed.decode_observations,
        "engine_observations": speed.engine_observations,
        "whole_observations": speed.whole_observations,
        "ttft_predictions": speed.ttft_predictions,
        # Its prefill steps as learned (core/batch_mixing.py): "with_decodes" (vLLM's chunked
        # prefill) or "alone" (SGLang's default), and how often that was found to change.
        "prefill_steps": "with_decodes" if speed.carries_decodes else "alone",
        "prefill_steps_changes": speed.kind_changes,
        # Taken back because the engine preempted meanwhile (core/preemptions.py).
        "discarded_observations": speed.discarded,
        # "learned" (its own fit), "fleet" (its fleet's, until it warms up), "given" (priors
        # given for this replica) or "prior" (the fleet's configured priors).
        "estimates_from": _source(speed, given),
        "ttft_error_p50": statistics.median(abs(r - 1) for r in ratios) if ratios else None,
        "ttft_ratio_p50": statistics.median(ratios) if ratios else None,
        "prior_prefill_tokens_per_s": speed.config.prefill_tokens_per_s,
        "prior_decode_step_s": speed.config.decode_step_s,
    }


def _source(speed: ReplicaSpeed, given: bool) -> str:
    if speed.warmed_up:
        return "learned"
    if speed.from_fleet:
        return "fleet"
    return "given" if given else "prior"


def effective_prefill_rate(speed: ReplicaSpeed) -> float:
    """``speed``'s prefill rate at its typical context (``context_cost.effective_rate``):
    the rate itself while it has no first tokens, or no attention."""
    kappa = context_per_token(speed.first_token_window) if speed.attention_s > 0 else 0.0
    return effective_rate(speed.prefill_tokens_per_s, speed.attention_s, kappa)
