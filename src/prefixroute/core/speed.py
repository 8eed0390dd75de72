"""Each replica's speed, learned online from what the router already hears.

No deployment prefills at one fixed rate: hardware, model, parallelism and neighbours on the GPU
decide it, and a fleet mixes them. So the configured rate and decode step are *priors*, and each
replica's own values replace them as its requests come back. One model covers both::

    seconds = tokens / prefill_rate + steps * decode_step  (+ overheads, attention: below)

and every completed request gives two observations of it:

* **Time to first token.** ``tokens`` is the work queued ahead of the request at dispatch (less
  what the replica had already done of it, below) plus its own uncached tokens (the prediction,
  or the replica's own count once :meth:`Router.observe_usage` reports it); ``steps`` is the
  batch steps that prefill spans plus half the step under way, when the replica was decoding
  (each such step also carries the decodes: vLLM's), else 0. An engine whose prefill runs alone
  (SGLang's default) waits only for the step under way: which kind a replica is, is learned
  (:mod:`prefixroute.core.batch_mixing`).
* **Decode phase.** From first to last token a request sees ``output_tokens - 1`` steps, each a
  decode step plus whatever prefill shared it: ``tokens`` is the uncached tokens whose first
  token came back from the same replica meanwhile.

The two are fitted *together* (weighted least squares over the last ``window`` observations of
each kind, each weighted by its prediction so that short and long requests count alike).
Estimating the rate from TTFTs and then the decode step from decode phases with that rate made
the two drift together: a rate too low explains too much of each decode step, leaving less for
the decode step, which in turn lowers the rate (the simulator's hot-prefix workload settled at
0.75x both). Fitted jointly, a decode phase that saw little prefill pins the decode step, and
one that saw a lot pins the rate.

**A fixed overhead per first token.** A first token measured at the gateway also carries what no
token count explains: the HTTP exchange, templating, scheduling, sampling. On two real vLLM
engines on the CPU (``tests/vllm``) it was 17-90 ms, where 100 uncached tokens take 8-14 ms.
Without the term the fit can only stretch the rate, and predicted short prompts' first tokens
at 0.14x their measured time, long ones' at 2.1x (medians). So a time to first token is
``first_token_overhead_s + tokens / rate + steps * step``, the overhead another unknown of the
same fit, per replica, with ``learn_overhead`` (prior 0: a fresh router predicts as before).

**Attention** (:mod:`prefixroute.core.context_cost`). A prompt token costs more the longer the
context before it, so each observation also carries its context work (token-kilotokens: the
queue's and its own) and ``attention`` is one more unknown, prior 0, never negative: a replica
whose cost does not grow with the context keeps the linear model, and one whose cost does no
longer hides it in an average rate that mispredicts long and short prompts alike.

**An answer that arrives whole** (a plain, non-streamed response) shows no first token, only
its end: its time from dispatch is the first token's plus its decode phase, and since both are
linear in the same unknowns, their sum is one observation of the same fit, in the first tokens'
window (:meth:`observe_first_token` with ``after`` = the decode phase's tokens and steps).
They warm no replica up: answers of similar shapes cannot tell a slower prefill from a longer
decode step (a replica sent only plain answers learned 2-8x its rate from its first dozen).
Once other observations have warmed it up, they join the fit (``whole_observations``).

**Scraped engine metrics** (:meth:`ReplicaSpeed.observe_engine_prefill`): an engine's own
prefill times per scrape interval (vLLM's ``vllm:request_prefill_time_seconds``), read as
``tokens / rate + requests * engine_overhead_s``, free of the queue ahead and of traffic this
router never saw: a third window in the same fit (:mod:`prefixroute.core.speed_fit`).

Elsewhere: **how queued work turns into waiting** (the progress on the queue, credited at each
refit) in :mod:`queue_credit`; **noise and outliers, priors and bounds, decode phases' weights**
in :mod:`speed_fit`; **a fresh replica in a running fleet** in :mod:`fleet_speed`; **a replica
that preempts** in :mod:`preemptions`; **how good the predictions are** in :mod:`speed_snapshot`.
Pure and clock-free (times come in as arguments). A refit (a pass over the windows, a sort of
each, a solve of two to five unknowns) runs per observation until the windows fill, then every
``REFIT_EVERY``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prefixroute.core._solve import Obs, PhaseObs, QueuedObs
from prefixroute.core.batch_mixing import flip, try_the_other_kind
from prefixroute.core.queue_credit import credit, derive, rederive
from prefixroute.core.speed_config import SpeedConfig, speed_priors_of
from prefixroute.core.speed_fit import fit_windows
from prefixroute.core.speed_snapshot import snapshot

__all__ = ["QueuedObs", "ReplicaSpeed", "SpeedConfig", "speed_priors_of"]

Estimates = tuple[float, float, float, float, float]  # rate, step, overheads, attention
REFIT_EVERY = 8  # observations between refits once a window is full (a refit is O(window))
CORRECTION_REFITS = 8  # at most this many refits settle a corrected observation (warm-up only)


@dataclass(slots=True)
class ReplicaSpeed:
    """One replica's learned prefill rate, decode step and overheads (module docstring)."""

    config: SpeedConfig = field(default_factory=SpeedConfig)
    prefill_tokens_per_s: float = 0.0  # current estimate, tokens/s (the prior until learned)
    decode_step_s: float = 0.0  # current estimate, seconds
    first_token_overhead_s: float = 0.0  # current estimate, seconds
    engine_overhead_s: float = 0.0  # the engine's own fixed prefill time per request, seconds
    attention_s: float = 0.0  # prefill seconds per token per 1k tokens of context before it
    prefill_observations: int = 0  # TTFTs observed since registration
    decode_observations: int = 0  # decode phases observed since registration
    engine_observations: int = 0  # scrape intervals with engine prefill times
    whole_observations: int = 0  # answers that arrived whole (also prefill observations)
    ttft_predictions: int = 0  # TTFTs predicted past the warm-up (judged in ``_ratios``)
    outliers: int = 0  # observations the last refit left out
    discarded: int = 0  # observations taken back (:meth:`discard_fresh`), since registration
    from_fleet: bool = False  # not warmed up, predicting with the fleet's estimates (start_from)
    carries_decodes: bool = True  # its prefill steps carry decodes (vLLM): core/batch_mixing.py
    mixing_trials: int = 0  # refits since the other kind was tried (core/batch_mixing.py)
    kind_changes: int = 0  # times it was found to be of the other kind (core/batch_mixing.py)
    _prefill: deque[Obs] = field(default_factory=deque)
    _decode: deque[PhaseObs] = field(default_factory=deque)
    _engine: deque[Obs] = field(default_factory=deque)
    _ratios: deque[float] = field(default_factory=deque)  # predicted / measured TTFTs
    _unfitted: int = 0  # observations since the last refit
    _whole: int = 0  # answers that came whole in the first tokens' window
    _fresh: list[int] = field(default_factory=lambda: [0, 0, 0])  # per window, since mark()

    def __post_init__(self) -> None:
        self._priors()
        cfg = self.config
        self._prefill = deque(maxlen=cfg.window)
        self._decode = deque(maxlen=cfg.window)
        self._engine = deque(maxlen=cfg.window)
        self._ratios = deque(maxlen=cfg.window)

    # --- predictions ----------------------------------------------------------------------
    def prefill_s(self, tokens: float, context: float = 0.0) -> float:
        """Seconds to prefill ``tokens`` with ``context`` work (core/context_cost.py) at this
        replica's estimates (decode overhead excluded)."""
        return tokens / self.prefill_tokens_per_s + context * self.attention_s

    def steps(self, tokens: float, decoding: bool) -> float:
        """Batch steps that carry decodes while ``tokens`` prefill, with half the step under
        way (0 when the replica is not decoding; the half alone when its prefill runs alone)."""
        if not decoding:
            return 0.0
        return (-(-tokens // self.config.step_tokens) + 0.5) if self.carries_decodes else 0.5

    def ttft_s(self, tokens: float, steps: float, context: float = 0.0) -> float:
        """Predicted time to first token of a request whose first token waits for ``tokens`` of
        prefill (the queue ahead and its own) with ``context`` work over ``steps``
        decode-carrying steps, seconds."""
        overhead = self.first_token_overhead_s
        return overhead + self.prefill_s(tokens, context) + steps * self.decode_step_s

    def progress(
        self, queued: float, elapsed_s: float, decoding: bool, context: float = 0.0
    ) -> float:
        """Tokens of ``queued`` (with ``context`` work) already prefilled after ``elapsed_s``
        seconds on it, tokens: each token at the queue's mean cost. Each step started spent one
        decode step on decodes when the replica was decoding."""
        if queued <= 0 or elapsed_s <= 0:
            return 0.0
        rate = self.prefill_tokens_per_s
        if context > 0 and self.attention_s > 0:  # slower by the queue's mean context cost
            rate = queued / self.prefill_s(queued, context)
        work_s = elapsed_s
        if decoding and self.decode_step_s > 0 and self.carries_decodes:
            step_s = self.config.step_tokens / rate + self.decode_step_s
            work_s -= math.ceil(elapsed_s / step_s) * self.decode_step_s
        return min(queued, max(0.0, work_s) * rate)

    def queue_work(
        self, queued: float, elapsed_s: float, decoding: bool, own: float,
        queued_context: float = 0.0, own_context: float = 0.0,
    ) -> tuple[float, float, float]:
        """(tokens, decode steps, context work) a first token waits for: what is left of
        ``queued`` (and its ``queued_context``) after ``elapsed_s`` on it, at the estimates of
        the moment, plus ``own`` uncached tokens (and ``own_context``)."""
        left = queued - self.progress(queued, elapsed_s, decoding, queued_context)
        context = own_context + (queued_context * left / queued if queued > 0 else 0.0)
        work = left + own
        return work, self.steps(work, decoding), context

    @property
    def warmed_up(self) -> bool:
        """Past the priors: the estimates are learned (``min_observations`` observations, not
        counting answers that came whole: module docstring)."""
        seen = len(self._prefill) - self._whole + len(self._decode) + len(self._engine)
        return self.config.learn and seen >= max(1, self.config.min_observations)

    @property
    def first_token_window(self) -> deque[Obs]:  # (reports read its typical context)
        return self._prefill

    def estimates(self) -> Estimates:
        """(prefill rate, decode step, first-token overhead, engine overhead, attention)."""
        return (self.prefill_tokens_per_s, self.decode_step_s, self.first_token_overhead_s,
                self.engine_overhead_s, self.attention_s)  # fmt: skip

    def start_from(self, fleet: Estimates, carries_decodes: bool = True) -> None:
        """Predict with ``fleet``'s estimates (:meth:`estimates`' order: learned on its peers)
        and kind of step (``carries_decodes``: batch_mixing) until warmed up, each within its
        bounds; once warmed up its own fit replaces them and this does nothing (fleet_speed)."""
        cfg = self.config
        if self.warmed_up or not cfg.learn or not cfg.fleet_prior:
            return
        rate, step, first, engine, attention = fleet
        # A learned overhead (or attention) only where this replica would learn one: otherwise
        # its predictions would carry a term its own fit then drops.
        self.set_within_bounds(
            rate, step, engine, first if cfg.learn_overhead else cfg.first_token_overhead_s,
            attention if cfg.learn_attention else cfg.attention_s,
        )
        self.from_fleet = True
        flip(self, self._prefill, self._decode, carries_decodes)  # the estimates' kind of step

    def ttft_ratios(self) -> list[float]:
        """``predicted / measured`` of the last ``window`` TTFTs predicted past the warm-up."""
        return list(self._ratios)

    # --- observations ---------------------------------------------------------------------
    def observe_prefill(
        self, tokens: float, steps: float, ttft_s: float, context: float = 0.0
    ) -> Obs | None:
        """A request covering ``tokens`` of prefill work (queued left + its own uncached), with
        ``context`` work, got its first token ``ttft_s`` after dispatch, sharing ``steps``
        decode steps. Judged first: what the model predicted for it, past the warm-up. Returns
        the observation (None: not taken)."""
        return self._take_prefill(Obs((tokens, steps, 0.0, 1.0, max(0.0, context)), ttft_s))

    def observe_first_token(
        self, queued: float, elapsed_s: float, decoding: bool, own: float, ttft_s: float,
        seq: int = 0, after: tuple[float, float, float] | None = None,
        queued_context: float = 0.0, own_context: float = 0.0,
    ) -> QueuedObs | None:
        """:meth:`observe_prefill` of a request sent behind ``queued`` tokens that the replica
        had been on for ``elapsed_s`` (:meth:`queue_work`), with ``own`` uncached tokens: its
        work is taken again at each refit (core/queue_credit.py). ``seq``: its place among the
        replica's dispatches, for :meth:`correct_queue`. ``after``: the request's answer came
        whole, ``ttft_s`` after dispatch, having also decoded this many (tokens prefilled for
        others meanwhile, decode steps, their context work) after its first token (module
        docstring). ``queued_context``, ``own_context``: the queue's and its own context work."""
        obs = QueuedObs((0.0, 0.0, 0.0, 1.0, 0.0), ttft_s, queued, elapsed_s, decoding, own,
                        max(0.0, queued_context), max(0.0, own_context), seq=seq)  # fmt: skip
        if after is not None:
            obs.after = (max(0.0, after[0]), max(0.0, after[1]), max(0.0, after[2]))
        derive(self, obs)  # its work from its queue at the estimates of the moment
        return obs if self._take_prefill(obs) is not None else None

    def correct_queue(self, after: int, through: int, tokens: float, context: float = 0.0) -> None:
        """The requests dispatched ``after+1``-th to ``through``-th waited behind ``tokens``
        (and ``context`` work) more or fewer than their observations say (core/queue_fixes.py)."""
        for o in self._prefill:
            if type(o) is QueuedObs and after < o.seq <= through:
                o.queued = max(0.0, o.queued + tokens)
                o.queued_context = max(0.0, o.queued_context + context)
                derive(self, o)

    def correct_decode(self, no: int, tokens: float, context: float = 0.0, seq: int = 0) -> None:
        """The ``no``-th first token's request (dispatched ``seq``-th) computed ``tokens`` (and
        ``context`` work) more than the decode phases it shared counted (negative: fewer;
        core/queue_fixes.py), and than the queues it was in at a phase's end (queue_credit)."""
        for o in self._decode:
            if o.correct(no, tokens, context, seq):
                credit(self, o)

    def _take_prefill(self, obs: Obs) -> Obs | None:
        tokens, steps, context = obs.x[0], obs.x[1], obs.x[4]
        ttft_s = obs.seconds
        if not self.config.learn or tokens < 0 or not math.isfinite(ttft_s) or ttft_s < 0:
            return None
        whole = obs.whole
        if self.warmed_up and ttft_s > 0 and not whole:  # a whole answer's is no TTFT
            self._ratios.append(self.ttft_s(tokens, steps, context) / ttft_s)
            self.ttft_predictions += 1
        window = self._prefill
        if len(window) == window.maxlen and window[0].whole:
            self._whole -= 1  # about to drop out of the window
        window.append(obs)
        self._fresh[0] += 1
        self.prefill_observations += 1
        self.whole_observations += whole
        self._whole += whole
        self._observed()
        return obs

    def correct_prefill(self, obs: QueuedObs, own: float, own_context: float = 0.0) -> None:
        """``obs`` (from :meth:`observe_first_token`) had ``own`` uncached tokens (and
        ``own_context`` work), as the replica reported after its first token taught the model.
        Past the warm-up, refits until the rate settles (one refit from estimates fitted on the
        wrong count stays near them)."""
        obs.own, obs.own_context = max(0.0, own), max(0.0, own_context)
        derive(self, obs)
        if not self.warmed_up or not any(o is obs for o in self._prefill):
            return
        for _ in range(CORRECTION_REFITS):
            before = self.prefill_tokens_per_s
            self._refit()
            if abs(self.prefill_tokens_per_s / before - 1.0) < 0.01:
                break

    def observe_decode(
        self, duration_s: float, steps: int, prefilled_tokens: float, context: float = 0.0,
        firsts: tuple[int, int] = (0, 0),
        queue: tuple[float, float, float, int] | None = None,
    ) -> None:
        """A request decoded ``steps`` more tokens in ``duration_s`` seconds, while the replica
        prefilled ``prefilled_tokens`` (with ``context`` work) for others in the same steps:
        its first tokens after the ``firsts[0]``-th through the ``firsts[1]``-th. ``queue``:
        it ended with prefill under way, (tokens queued, seconds the replica had been on them,
        their context work, the replica's dispatches by then), credited as a first token's
        queue is, with decode steps (core/queue_credit.py)."""
        if not self.config.learn or steps < 1 or not math.isfinite(duration_s) or duration_s < 0:
            return
        x = (max(0.0, prefilled_tokens), steps, 0.0, 0.0, max(0.0, context))
        obs = PhaseObs(x, duration_s, firsts[0], firsts[1])
        if queue is not None and queue[0] > 0 and queue[1] > 0:
            obs.queued, obs.elapsed_s = queue[0], queue[1]
            obs.queued_context, obs.queue_seq = max(0.0, queue[2]), queue[3]
            credit(self, obs)
        self._decode.append(obs)
        self._fresh[1] += 1
        self.decode_observations += 1
        self._observed()

    def observe_engine_prefill(
        self, tokens: float, requests: int, seconds: float, context: float = 0.0
    ) -> None:
        """The engine reports that ``requests`` requests spent ``seconds`` in all from being
        scheduled to their first token, computing ``tokens`` uncached prompt tokens (one scrape
        interval of its prefill-time histogram), with ``context`` work (an estimate: the engine
        does not say how long each prompt's context was)."""
        if not self.config.learn or requests < 1 or tokens < 0:
            return
        if not math.isfinite(seconds) or not math.isfinite(tokens) or seconds <= 0:
            return
        self._engine.append(Obs((tokens, 0.0, float(requests), 0.0, max(0.0, context)), seconds))
        self._fresh[2] += 1
        self.engine_observations += 1
        self._observed()

    def mark(self) -> None:  # what is learned from now on is fresh (discard_fresh)
        self._fresh = [0, 0, 0]

    def discard_fresh(self) -> int:
        """Take back the observations learned since :meth:`mark` (core/preemptions.py) and
        refit without them (back to the priors if too few are left); marks. Returns how many."""
        windows: tuple[deque[Any], ...] = (self._prefill, self._decode, self._engine)
        taken = 0
        for k, window in enumerate(windows):
            n = min(self._fresh[k], len(window))
            taken += n
            self._whole -= sum(window.pop().whole for _ in range(n))
        self._fresh, self.discarded = [0, 0, 0], self.discarded + taken  # marks
        if taken and self.warmed_up:
            self._refit()
        elif taken:
            self._priors()
        return taken

    def _observed(self) -> None:
        cfg = self.config
        self._unfitted += 1
        if not self.warmed_up:
            return
        seen = len(self._prefill) + len(self._decode) + len(self._engine)
        # Refit at every observation while the windows fill, then every few: a refit costs
        # O(window), and a few observations more or less do not move a window's estimate.
        if self._unfitted >= REFIT_EVERY or seen < cfg.window:
            self._unfitted = 0
            self._refit()

    # --- the fit --------------------------------------------------------------------------
    def theta(self) -> list[float]:  # the fit's unknowns at the estimates (speed_fit)
        return [1.0 / self.prefill_tokens_per_s, self.decode_step_s, self.engine_overhead_s,
                self.first_token_overhead_s, self.attention_s]  # fmt: skip

    def _refit(self) -> None:
        """Weighted least squares of ``seconds = tokens * b + steps * d (+ the overheads)``
        over the windows (module docstring, :func:`speed_fit.fit_windows`); then ``rate = 1 /
        b``, every estimate within its bounds."""
        self.from_fleet = False
        rederive(self, self._prefill, self._decode)  # every queue at the current estimates
        theta, self.outliers = self.fit()
        self.set_within_bounds(1.0 / theta[0], theta[1], theta[2], theta[3], theta[4])
        try_the_other_kind(self, self._prefill, self._decode)  # do prefill steps carry decodes?

    def fit(self) -> tuple[list[float], int]:
        """The fit over the windows as their work stands (``_refit``): (``[1 / rate, step,
        engine overhead, first-token overhead, attention]`` unbounded, observations left out)."""
        windows = (self._prefill, self._decode, self._engine)
        return fit_windows(self.config, self.theta(), windows, self._whole)

    def _priors(self) -> None:  # the configured estimates, as before anything is learned
        cfg = self.config
        self.prefill_tokens_per_s, self.decode_step_s = cfg.prefill_tokens_per_s, cfg.decode_step_s
        self.first_token_overhead_s, self.engine_overhead_s = cfg.first_token_overhead_s, 0.0
        self.attention_s = cfg.attention_s

    def set_within_bounds(
        self, rate: float, step: float, engine: float, first: float, attention: float
    ) -> None:
        """Take these estimates, each within its bounds (:meth:`SpeedConfig.within_bounds`)."""
        bounded = self.config.within_bounds(rate, step, engine, first, attention)
        self.prefill_tokens_per_s, self.decode_step_s = bounded[0], bounded[1]
        self.engine_overhead_s, self.first_token_overhead_s = bounded[2], bounded[3]
        self.attention_s = bounded[4]

    def snapshot(self) -> dict[str, float | int | str | None]:
        """The estimates and their evidence, for reports and the admin API (speed_snapshot)."""
        return snapshot(self)
