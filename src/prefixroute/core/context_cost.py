"""What a prompt token's prefill costs beyond the linear part: attention over the context.

A prompt token attends to every token before it, so its prefill costs more the longer the
context it joins: ``1/rate + attention * context / 1000`` seconds for a token with ``context``
tokens before it. On a GPU the linear part (the weights) dominates short prompts, and
attention catches up with it at tens of thousands of tokens (for Llama-3-8B, a token's
attention FLOPs equal its linear FLOPs at roughly 30k tokens of context; a smaller model, a
longer context or a less efficient kernel brings that closer). So a speed model without the
term learns an *effective* rate, the average over the traffic it saw: too fast for a long
prompt, too slow for a short one, and too slow for a short question behind a long cached
conversation (the new tokens attend to all of it). On a replica written by others that models
attention (``benchmarks/foreign_replica_c.py``) the learned rates were 5,000-6,900 tokens/s
where its linear part is 10,000.

A request whose prompt has ``cached`` tokens already in the cache and ``uncached`` to compute
pays, summed over those tokens (token ``i`` of them has ``cached + i`` before it)::

    uncached * (cached + uncached / 2) / 1000      token-kilotokens of context work

and the speed model learns ``attention`` (seconds per token per 1,000 tokens of context) as
one more unknown of the same fit (:mod:`prefixroute.core.speed`), its prior 0: a replica
whose cost does not grow with the context keeps the linear model. The load view sums the work
of each replica's queue as it sums its tokens (:class:`~prefixroute.core.replica_load.ReplicaLoad`).
"""

from __future__ import annotations

CONTEXT_UNIT = 1000.0  # tokens of context the attention estimate is per: s / token / 1k tokens


def context_work(cached: float, uncached: float) -> float:
    """Context work of computing ``uncached`` prompt tokens after ``cached`` ones already in
    the cache, token-kilotokens (module docstring)."""
    if uncached <= 0:
        return 0.0
    return uncached * (max(0.0, cached) + uncached / 2) / CONTEXT_UNIT


def doubling_context(rate: float, attention: float) -> float | None:
    """The context length at which a token's prefill costs twice what it costs with nothing
    before it, at prefill ``rate`` and ``attention``, tokens (None: attention costs nothing)."""
    if attention <= 0:
        return None
    return CONTEXT_UNIT / (rate * attention)


def effective_rate(rate: float, attention: float, context_per_token: float) -> float:
    """The prefill rate of a token at ``context_per_token`` (token-kilotokens per token: a
    replica's typical context, from its first tokens), tokens/s: ``1 / (1/rate + attention *
    context_per_token)``. Where most of each prompt is cached (multi-turn), the fit splits a
    token's cost between the rate and attention with little to tell them apart: a replica
    slowed from 20,000 to 5,000 tokens/s showed a rate of 200,000 (its bound) beside a large
    attention term. The split is loose; their sum at the typical context is what the first
    tokens measured, and what a reader comparing with the replica's real speed wants."""
    return 1.0 / (1.0 / rate + max(0.0, attention) * max(0.0, context_per_token))
