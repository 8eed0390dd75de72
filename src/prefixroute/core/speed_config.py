"""The priors, bounds and memory of the per-replica speed model (:mod:`prefixroute.core.speed`),
and the priors a policy's own config implies."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from prefixroute.core.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Speeds = TypeVar("_Speeds", bound="DataclassInstance")


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
    first_token_overhead_s: float = 0.0  # prior fixed time of every first token, seconds
    learn_overhead: bool = False  # learn that overhead too (the gateway does by default)
    fleet_prior: bool = True  # a replica not warmed up predicts with its fleet's (load.py)
    # Prior prefill seconds per token per 1k tokens of context before it (core/context_cost.py)
    attention_s: float = 0.0
    learn_attention: bool = True  # learn it (False: it stays at its prior)

    def __post_init__(self) -> None:
        # Finite too: a NaN rate passed "<= 0" and was refused later under attention_s's
        # name; an infinite one was taken (the CLI audit, 2026-12-07).
        rate, step = self.prefill_tokens_per_s, self.decode_step_s
        if not (0 < rate < math.inf and 0 <= step < math.inf) or self.step_tokens < 1:
            raise ConfigError(
                "speed priors: prefill rate and step budget must be positive, decode step >= 0, "
                f"all finite: got {rate:g}, {self.step_tokens}, {step:g}"
            )
        if self.window < 2 or self.min_observations < 0 or self.bound < 1:
            raise ConfigError("speed model: window >= 2, min_observations >= 0, bound >= 1")
        if self.outlier_factor <= 1:
            raise ConfigError("speed model: outlier_factor must be above 1")
        if self.first_token_overhead_s < 0:
            raise ConfigError("speed priors: first_token_overhead_s must be >= 0")
        if not 0 <= self.attention_s <= self.most_attention_s:
            raise ConfigError(
                f"speed priors: attention_s must be between 0 and {self.most_attention_s:g}"
            )

    @property
    def overhead_scale_s(self) -> float:
        """What an overhead is judged against: one full batch step at the priors, seconds. An
        overhead's prior counts as one observation of that size, and it stays under ``bound``
        times it."""
        return self.step_tokens / self.prefill_tokens_per_s + self.decode_step_s

    @property
    def most_attention_s(self) -> float:
        """The largest attention estimate: a token with 1k tokens of context before it costs at
        most the slowest allowed rate's whole time more, seconds per token per 1k tokens."""
        return self.bound / self.prefill_tokens_per_s

    def within_bounds(
        self, rate: float, step: float, engine: float, first: float, attention: float = 0.0
    ) -> tuple[float, float, float, float, float]:
        """These estimates, each within its bounds: the rate and the decode step within
        ``bound`` of their priors, the overheads between 0 and ``bound`` full steps, attention
        between 0 and :attr:`most_attention_s`."""
        rate = min(max(rate, self.prefill_tokens_per_s / self.bound),
                   self.prefill_tokens_per_s * self.bound)  # fmt: skip
        d0, lo = self.decode_step_s, self.decode_step_s / self.bound  # a prior of 0: at least 0
        step = min(max(step, lo), d0 * self.bound) if d0 > 0 else max(step, lo)
        most = self.bound * self.overhead_scale_s
        attention = min(max(attention, 0.0), self.most_attention_s)
        return rate, step, min(max(engine, 0.0), most), min(max(first, 0.0), most), attention


@dataclass(frozen=True, slots=True)
class SpeedPrior:
    """One replica's own priors, where its operator knows them (a GPU generation other than
    the fleet's, say); None keeps the fleet's. A replica with its own priors predicts with them
    until its estimates are its own, not with the fleet's learned median (core/load.py), and
    its estimates are pulled towards them and bounded around them."""

    prefill_tokens_per_s: float | None = None  # tokens/s
    decode_step_s: float | None = None  # seconds
    # Requests its engine runs at once (vLLM's max_num_seqs, SGLang's max_running_requests):
    # not a speed, a fact its operator set, which no estimate replaces (core/batch_slots.py).
    max_running: int | None = None  # requests

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> SpeedPrior:
        """Priors by their field names, each a number (``max_running`` a whole one): how a
        ``[[replicas]]`` entry and an admin request give them; raises ConfigError naming the
        key at fault."""
        unknown = sorted(set(values) - set(SPEED_PRIOR_KEYS))
        if unknown:
            names = ", ".join(SPEED_PRIOR_KEYS)
            raise ConfigError(f"a replica's speed priors are {names}; not {unknown}")
        given: dict[str, float | int] = {}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{key} must be a number, got {value!r}")
            given[key] = _whole(key, value) if key == "max_running" else float(value)
        return cls(**given)  # type: ignore[arg-type]

    @property
    def has_speeds(self) -> bool:
        """A prefill rate or a decode step is given (not only ``max_running``)."""
        return self.prefill_tokens_per_s is not None or self.decode_step_s is not None

    def __post_init__(self) -> None:
        rate, step = self.prefill_tokens_per_s, self.decode_step_s
        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ConfigError(f"a replica's prefill_tokens_per_s must be positive, got {rate}")
        if step is not None and not (math.isfinite(step) and step >= 0):
            raise ConfigError(f"a replica's decode_step_s must be 0 or more, got {step}")
        slots = self.max_running
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int)
                                  or slots < 1):  # fmt: skip
            raise ConfigError(f"a replica's max_running must be a whole number >= 1, got {slots}")

    def applied_to(self, config: _Speeds) -> _Speeds:
        """``config`` (a :class:`SpeedConfig`, or any dataclass with these two fields: the
        simulator's replica, whose speed changes mid-run) with these speeds in place of its
        own, where they are given."""
        given = (("prefill_tokens_per_s", self.prefill_tokens_per_s),
                 ("decode_step_s", self.decode_step_s))  # fmt: skip
        return dataclasses.replace(config, **{k: v for k, v in given if v is not None})


SPEED_PRIOR_KEYS = ("prefill_tokens_per_s", "decode_step_s", "max_running")  # SpeedPrior's fields


def _whole(key: str, value: float) -> int:
    """``value`` as a whole number (8 or 8.0), else ConfigError naming ``key``."""
    if not (math.isfinite(value) and value == int(value)):
        raise ConfigError(f"{key} must be a whole number, got {value!r}")
    return int(value)


def speed_priors_of(policy: object) -> SpeedConfig:
    """Speed priors from a policy's config fields of the same names, where it has them (a fresh
    router then predicts with exactly the numbers its policy was configured with)."""
    config = getattr(policy, "config", None)
    d = SpeedConfig()
    return SpeedConfig(
        prefill_tokens_per_s=getattr(config, "prefill_tokens_per_s", d.prefill_tokens_per_s),
        decode_step_s=getattr(config, "decode_step_s", d.decode_step_s),
        step_tokens=getattr(config, "step_tokens", d.step_tokens),
    )
