"""Each replica's speed, learned online from what the router already hears.

No deployment prefills at one fixed rate: hardware, model, parallelism and neighbours on the GPU
decide it, and a fleet mixes them. So the configured rate and decode step are *priors*, and each
replica's own values replace them as its requests come back. One model covers both::

    seconds = tokens / prefill_rate + steps * decode_step

and every completed request gives two observations of it:

* **Time to first token.** ``tokens`` is the work queued ahead of the request at dispatch (less
  what the replica had already done of it, below) plus its own uncached tokens (the prediction,
  or the replica's own count once :meth:`Router.observe_usage` reports it); ``steps`` is the
  batch steps that prefill spans plus half the step under way, when the replica was decoding
  (each such step also carries the decodes), else 0.
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

**How queued work turns into waiting.** The queued tokens counted at dispatch include the part
of the head request the replica has already prefilled. Counting it in full makes the wait look
longer than it is, and a rate fitted on it comes out too high on lightly loaded fast replicas
(+25% in the simulator under round robin). So the load view keeps ``busy_since``, when the
replica started on its current queue (the first dispatch to an idle replica, or the last first
token while work remained), and credits the replica with ``rate x (elapsed - one decode step per
step started)`` tokens of progress, never more than is queued (:meth:`ReplicaSpeed.progress`).

**Noise and outliers.** Each refit compares every observation with its prediction; those more
than ``outlier_factor`` (3x) off the typical misprediction, the median over the newer half of
the window, are left out (a network stall, a pause). A real change of speed becomes the typical
misprediction once it fills half of that newer half, so a replica that slows down or speeds up
is followed within a few dozen of its requests (``window`` = 64: the simulator's traces settle
within 35-160), while outliers stay out as long as they are under half of the recent requests.

**Priors and bounds.** Until a replica has ``min_observations`` observations its estimates are
the priors exactly, so a fresh router routes as the fixed constants did. Afterwards each prior
still counts as one observation, which settles what the data leave open (every request of a
replica the same size: rate and decode step trade off), and every estimate stays within
``prior / bound .. prior * bound``.

The estimator is pure and clock-free, like the rest of the core: times come in as arguments.
A refit is one pass over both windows and two sorts of 64 numbers; it runs at every observation
while the windows fill and every ``REFIT_EVERY`` observations after that (13 us per request
measured on one core of a small 2-core machine).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from prefixroute.core.errors import ConfigError

REFIT_EVERY = 8  # observations between refits once a window is full (a refit is O(window))


@dataclass(frozen=True, slots=True)
class SpeedConfig:
    """Priors, bounds and memory of the per-replica speed estimates."""

    prefill_tokens_per_s: float = 10_000.0  # prior prefill rate, tokens/s (the article's figure)
    decode_step_s: float = 0.015  # prior time a batch step spends on decodes, seconds
    step_tokens: int = 2048  # engine token budget per step, tokens (counts a prefill's steps)
    window: int = 64  # observations kept per estimate: changes are followed within ~window/2
    min_observations: int = 8  # below this many, the estimate is the prior, observations
    bound: float = 20.0  # estimates stay within prior / bound .. prior * bound
    outlier_factor: float = 3.0  # TTFTs this many times off the typical misprediction: outliers
    learn: bool = True  # False: the estimates stay at the priors (fixed constants)

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.decode_step_s < 0 or self.step_tokens < 1:
            raise ConfigError(
                "speed priors: prefill rate and step budget must be positive, decode step >= 0"
            )
        if self.window < 2 or self.min_observations < 0 or self.bound < 1:
            raise ConfigError("speed model: window >= 2, min_observations >= 0, bound >= 1")
        if self.outlier_factor <= 1:
            raise ConfigError("speed model: outlier_factor must be above 1")


@dataclass(slots=True)
class _Obs:
    """One observation of the model ``seconds = tokens / rate + steps * decode_step``."""

    tokens: float  # prefill tokens the time covered, tokens
    steps: float  # batch steps that also carried decodes, steps
    seconds: float  # the time measured, seconds


@dataclass(slots=True)
class ReplicaSpeed:
    """One replica's learned prefill rate and decode step (see the module docstring)."""

    config: SpeedConfig = field(default_factory=SpeedConfig)
    prefill_tokens_per_s: float = 0.0  # current estimate, tokens/s (the prior until learned)
    decode_step_s: float = 0.0  # current estimate, seconds
    prefill_observations: int = 0  # TTFTs observed since registration
    decode_observations: int = 0  # decode phases observed since registration
    outliers: int = 0  # observations the last refit left out
    _prefill: deque[_Obs] = field(default_factory=deque)
    _decode: deque[_Obs] = field(default_factory=deque)
    _unfitted: int = 0  # observations since the last refit

    def __post_init__(self) -> None:
        cfg = self.config
        self.prefill_tokens_per_s = cfg.prefill_tokens_per_s
        self.decode_step_s = cfg.decode_step_s
        self._prefill = deque(maxlen=cfg.window)
        self._decode = deque(maxlen=cfg.window)

    # --- predictions ----------------------------------------------------------------------
    def prefill_s(self, tokens: float) -> float:
        """Seconds to prefill ``tokens`` at this replica's rate (decode overhead excluded)."""
        return tokens / self.prefill_tokens_per_s

    def steps(self, tokens: float, decoding: bool) -> float:
        """Batch steps that carry decodes while ``tokens`` prefill, with half the step under
        way (0 when the replica is not decoding)."""
        return (-(-tokens // self.config.step_tokens) + 0.5) if decoding else 0.0

    def progress(self, queued: float, elapsed_s: float, decoding: bool) -> float:
        """Tokens of ``queued`` already prefilled after ``elapsed_s`` seconds on it, tokens.

        Each step started spent one decode step on decodes when the replica was decoding.
        """
        if queued <= 0 or elapsed_s <= 0:
            return 0.0
        rate = self.prefill_tokens_per_s
        work_s = elapsed_s
        if decoding and self.decode_step_s > 0:
            step_s = self.config.step_tokens / rate + self.decode_step_s
            work_s -= math.ceil(elapsed_s / step_s) * self.decode_step_s
        return min(queued, max(0.0, work_s) * rate)

    # --- observations ---------------------------------------------------------------------
    def observe_prefill(self, tokens: float, steps: float, ttft_s: float) -> None:
        """A request covering ``tokens`` of prefill work (queued left + its own uncached) got
        its first token ``ttft_s`` after dispatch, sharing ``steps`` decode steps."""
        if not self.config.learn or tokens < 0 or not math.isfinite(ttft_s) or ttft_s < 0:
            return
        self._prefill.append(_Obs(tokens, steps, ttft_s))
        self.prefill_observations += 1
        self._observed()

    def observe_decode(self, duration_s: float, steps: int, prefilled_tokens: float) -> None:
        """A request decoded ``steps`` more tokens in ``duration_s`` seconds, while the replica
        prefilled ``prefilled_tokens`` for others in the same steps."""
        if not self.config.learn or steps < 1 or not math.isfinite(duration_s) or duration_s < 0:
            return
        self._decode.append(_Obs(max(0.0, prefilled_tokens), steps, duration_s))
        self.decode_observations += 1
        self._observed()

    def _observed(self) -> None:
        cfg = self.config
        self._unfitted += 1
        seen = len(self._prefill) + len(self._decode)
        if seen < max(1, cfg.min_observations):
            return
        # Refit at every observation while the window fills, then every few: a refit costs
        # O(window), and a few observations more or less do not move a window's estimate.
        if self._unfitted >= REFIT_EVERY or seen < cfg.window:
            self._unfitted = 0
            self._refit()

    def _refit(self) -> None:
        """Weighted least squares of ``seconds = tokens * b + steps * d`` over both windows,
        each observation weighted by its prediction (relative errors), outliers left out, with
        the priors as one observation each; then ``rate = 1 / b``."""
        cfg = self.config
        b, d = 1.0 / self.prefill_tokens_per_s, self.decode_step_s
        b0, d0 = 1.0 / cfg.prefill_tokens_per_s, cfg.decode_step_s
        factor = cfg.outlier_factor
        # The priors, one observation each: "b is b0" and "d is d0".
        a00, a01, a11 = 1.0 / (b0 * b0), 0.0, 0.0
        c0, c1 = 1.0 / b0, 0.0
        if d0 > 0:
            a11 += 1.0 / (d0 * d0)
            c1 += 1.0 / d0
        dropped = 0
        for window in (self._prefill, self._decode):
            if not window:
                continue
            preds = [max(o.tokens * b + o.steps * d, 1e-9) for o in window]
            ratios = [o.seconds / p for o, p in zip(window, preds, strict=True)]
            # The typical misprediction, among the newer half: a change of speed becomes the
            # norm once it is half of that, and is no longer taken for a run of outliers.
            recent = sorted(ratios[len(ratios) // 2 :])
            centre = recent[len(recent) // 2]
            low, high = centre / factor, centre * factor
            for o, p, r in zip(window, preds, ratios, strict=True):
                if not low <= r <= high:
                    dropped += 1
                    continue
                x, k = o.tokens / p, o.steps / p
                a00 += x * x
                a01 += x * k
                a11 += k * k
                c0 += x * r
                c1 += k * r
        self.outliers = dropped
        det = a00 * a11 - a01 * a01
        if det > 0:
            b_new = (c0 * a11 - c1 * a01) / det
            d_new = (a00 * c1 - a01 * c0) / det
        else:
            b_new, d_new = b, d
        if d_new < 0:  # no time left for decodes: fit the rate alone
            d_new = 0.0
            b_new = c0 / a00
        if b_new <= 0:  # no time left for prefill: keep the rate, fit the step alone
            b_new = b
            d_new = max(0.0, (c1 - a01 * b) / a11) if a11 > 0 else d
        rate = 1.0 / b_new
        self.prefill_tokens_per_s = min(max(rate, cfg.prefill_tokens_per_s / cfg.bound),
                                        cfg.prefill_tokens_per_s * cfg.bound)  # fmt: skip
        if d0 > 0:
            d_new = min(max(d_new, d0 / cfg.bound), d0 * cfg.bound)
        self.decode_step_s = d_new

    def snapshot(self) -> dict[str, float | int]:
        """The estimates and their evidence, for reports and the admin API."""
        return {
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_step_s": self.decode_step_s,
            "prefill_observations": self.prefill_observations,
            "decode_observations": self.decode_observations,
            "prior_prefill_tokens_per_s": self.config.prefill_tokens_per_s,
            "prior_decode_step_s": self.config.decode_step_s,
        }
