"""The speed model's normal equations (:mod:`prefixroute.core.speed`): its priors, then its
windows of observations, in the unknowns ``theta = (1/rate, decode step, engine overhead,
first-token overhead, attention)``.

**Noise and outliers.** Each refit compares every observation with its prediction; those more
than ``outlier_factor`` (3x) off the typical misprediction, the median over the newer half of
the window, are left out (a network stall, a pause). A real change of speed becomes the typical
misprediction once it fills half of that newer half, so a replica that slows down or speeds up
is followed within a few dozen of its requests (``window`` = 64: the simulator's traces settle
within 35-160), while outliers stay out as long as they are under half of the recent requests.

**Priors and bounds.** Until a replica has ``min_observations`` observations its estimates are
the priors exactly. Afterwards each prior counts as ``PRIOR_WEIGHT`` (a quarter) of an
observation, weighed so that a replica 4x slower than it and one 4x faster are pulled alike: it
only settles what the data leave open (every request the same size: rate and decode step trade
off). Weighed by its own prediction, it held a 4x slower replica at 1.35x its rate; as a whole
observation, multi-turn's fast replicas 17% under theirs. Every estimate stays within
``prior / bound .. prior * bound``. Attention's prior is 0 (a replica whose cost does not grow
with the context keeps the linear model), and it stays between 0 and ``bound / prior rate``
(a token with 1k tokens before it costs at most the slowest allowed rate's whole time more).

**A decode phase's count** of the prefill that shared its steps (the uncached tokens of the
requests whose first tokens came back meanwhile) counts in full the prefill under way at its
start, and the one under way at its end only as the model's estimate of its progress
(core/queue_credit.py): off by up to a request's prefill, whatever the phase's length. Judged
against its prediction alone, a phase of one step that shared another's chunk looked 20x slow,
and on the synthetic Mooncake trace at capacity the fit took a decode step of about 0.2 s (15 ms
true) and a rate 4.4x the truth to match (10,000 tokens/s learned at 44,327). So a phase's error
is judged against its prediction plus the time of a typical request's prefill (the mean own
uncached tokens in the first tokens' window): short phases weigh less, long ones as before; the
outlier test still compares the prediction alone.

**The engine's prefill times** (vLLM's ``vllm:request_prefill_time_seconds``, per scrape
interval) run from a request's scheduling to its first token, so a step that carries chunks of
``k`` prompts is in each of their ``k`` times; the model reads an interval as its prompts' own
tokens (``tokens / rate + requests * engine overhead``). That holds while prompts rarely share
steps, and not under a backlog, where they always do: in the simulator the intervals' sums came
to a median 2-4x the prompts' own time, and the rates fitted with them up to 7.4x off where the
first tokens alone held them within 1.5x. The intervals are what the router learns from when
it sees no first tokens (answers that come whole), so they are left out only while the first
tokens' window is full of streamed ones (:func:`engine_window`): a fleet with a share of plain
answers fits them as before (docs/results.md, *The engine's prefill times*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefixroute.core import _native
from prefixroute.core._solve import Obs, QueuedObs, add_observations, solve_feasible
from prefixroute.core.speed_config import SpeedConfig

PRIOR_WEIGHT = 0.25  # observations a prior counts as (module docstring)


def normal_equations(
    cfg: SpeedConfig, theta: list[float], windows: Sequence[Sequence[Obs]]
) -> tuple[list[list[float]], list[float], int]:
    """``A``, ``c`` of the weighted least squares around the current estimates ``theta``, and
    how many observations were left out: the priors, one observation each, then every window's
    observations within ``outlier_factor`` of its typical misprediction, each divided by its
    prediction (relative errors; a decode phase's, by its prediction plus a typical request's
    prefill: module docstring). ``windows``: first tokens, decode phases, engine reports."""
    a = [[0.0] * 5 for _ in range(5)]
    b0, d0, scale = 1.0 / cfg.prefill_tokens_per_s, cfg.decode_step_s, cfg.overhead_scale_s
    # The prior rate is a token's cost at the context the replica's tokens typically have
    # (``kappa``: its first tokens' context work per token), 1/rate + kappa * attention: a rate
    # measured on real traffic includes its attention. Were it 1/rate alone, attention would be
    # a way round the prior: a replica fitted exactly by a slower rate and no attention learned
    # a rate 6% nearer the prior and an attention it did not have.
    kappa = _context_per_token(windows[0]) if windows else 0.0
    # A prior's error weighs w / (b * sqrt(b * b0)) at the current estimate b: a replica
    # as far above its prior as another is below it is pulled alike (module docstring).
    b = theta[0] + kappa * theta[4]
    w = PRIOR_WEIGHT / (b * math.sqrt(b * b0))
    c = [w * b0, 0.0, 0.0, cfg.first_token_overhead_s / (scale * scale), w * kappa * b0]
    a[0][0] = w
    if kappa:
        a[0][4] = a[4][0] = w * kappa
        a[4][4] = w * kappa * kappa
    if d0 > 0:
        d = theta[1] if theta[1] > 0 else d0
        w = PRIOR_WEIGHT / (d * math.sqrt(d * d0))
        a[1][1] += w
        c[1] += w * d0
    a[2][2] = a[3][3] = 1.0 / (scale * scale)  # each overhead: "as the prior", once
    # Attention (seconds per token per 1k tokens of context) judged against a token's whole
    # time at the current rate: its prior only settles what the data leave open (every request
    # of one length and context: rate and attention trade off), as the rate's does.
    w = PRIOR_WEIGHT / (b * b)
    a[4][4] += w
    c[4] += w * cfg.attention_s
    # A decode phase's prefill count can be off by a request's, whatever the phase's length.
    slacks = (0.0, _typical_own(windows[0])) if len(windows) > 1 else ()
    outliers = add_observations(a, c, windows, theta, cfg.outlier_factor, slacks)
    return a, c, outliers


def engine_window(
    first_tokens: Sequence[Obs], whole: int, engine: Sequence[Obs], window: int
) -> Sequence[Obs]:
    """The engine's intervals to fit beside ``first_tokens`` (of which ``whole`` are answers
    that came whole): ``engine``, or none while ``first_tokens`` holds ``window`` streamed
    first tokens, a full window (module docstring)."""
    return () if len(first_tokens) - whole >= window else engine


def _context_per_token(window: Sequence[Obs], compiled: bool = True) -> float:
    """Context work per token of ``window``'s observations, token-kilotokens per token
    (compiled when built, to the bit: ``compiled=False`` runs this reference)."""
    if compiled and _native.context_per_token is not None:
        return _native.context_per_token(window)
    tokens = context = 0.0
    for o in window:  # one pass: this runs at every refit (the simulator's hot path)
        x = o.x
        tokens += x[0]
        context += x[4]
    return context / tokens if tokens > 0 else 0.0


def _typical_own(window: Sequence[Obs]) -> float:
    """The mean uncached tokens of ``window``'s first tokens' own requests (0: none known)."""
    total, n = 0.0, 0
    for o in window:
        if type(o) is QueuedObs:
            total += o.own
            n += 1
    return total / n if n else 0.0


def fit_windows(
    cfg: SpeedConfig, theta: list[float], windows: tuple[Sequence[Obs], ...], whole: int
) -> tuple[list[float], int]:
    """The least-squares fit around ``theta`` over ``windows`` (first tokens, decode phases,
    engine reports; ``whole``: answers that came whole among the first tokens): the unbounded
    ``theta`` and how many observations were left out. An overhead is fitted only when there
    is something to fit it on: engine reports for the engine's, ``learn_overhead`` for the
    first tokens'; attention with ``learn_attention``."""
    first, decode, engine = windows
    engine = engine_window(first, whole, engine, cfg.window)
    a, c, outliers = normal_equations(cfg, theta, (first, decode, engine))
    free = [0, 1, 2] if engine else [0, 1]
    if cfg.learn_overhead and first:
        free.append(3)
    if cfg.learn_attention:
        free.append(4)
    return solve_feasible(a, c, theta, free), outliers
