"""Prompt tokens counted without a tokenizer: characters per token, learned per model.

Approximate mode keys a request on its text, so the router knows its length in characters, while
every cost it weighs (queued prefill, uncached tokens, predicted cached tokens) is in the
engine's tokens. Four characters a token is a rule of thumb for English under GPT-style BPEs;
real tokenizers differ (the emulated replica's word-level one makes 4.9 characters of chat
routing text a token in ``tests/gateway/test_calibration.py``; the tiny BPE of the recorded vLLM
answers in ``tests/data`` 2.7 to 3.4), and a chat's template adds tokens the text does not
show. With the fixed guess a fresh gateway predicted more cached tokens than the replica
reported in 32 of 36 requests (issue 11), some above the whole prompt.

So the ratio is learned from the replicas' own counts: each answer's ``usage.prompt_tokens``
against the length of the text the request was routed on (the same text, so the ratio absorbs
the chat template and the role markers). One estimate per model name: models have their own
tokenizers, and adapters of one base model just learn the same number.

**Estimator.** The median of the last ``window`` ratios, each weighted by its prompt's tokens,
with the prior among them as one prompt of ``prior_tokens`` tokens: a median, so that a few odd
prompts (mostly template, or an image part rendered as JSON) move nothing; weighted, so that
the long prompts, whose costs dominate, count most, and a two-word prompt swamped by its
template counts little. So one 300-token answer replaces the prior, while a handful of
two-token greetings leave it alone; once the window holds a few thousand tokens the prior no
longer matters. The
estimate is recomputed at each observation (a sort of 65 numbers), read at every request, and
always stays within the bounds.

The router feeds it (:meth:`Router.route` remembers a text request's characters and model,
:meth:`Router.observe_usage` brings the replica's count, :meth:`Router.complete` forgets the
request), so every front end that reports usage calibrates it. Token-id requests count exactly
and teach it nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from prefixroute.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TokenCountConfig:
    """Prior, bounds and memory of the characters-per-token estimates."""

    chars_per_token: float = 4.0  # prior, characters per token (English under GPT-style BPEs)
    min_chars_per_token: float = 0.25  # lower bound, characters per token (CJK in byte BPEs)
    max_chars_per_token: float = 16.0  # upper bound, characters per token
    window: int = 64  # observations kept per model, observations
    prior_tokens: int = 64  # the prior weighs as one prompt of this many tokens, tokens
    learn: bool = True  # False: every model stays at the prior (the fixed rule of thumb)

    def __post_init__(self) -> None:
        lo, hi = self.min_chars_per_token, self.max_chars_per_token
        if not 0 < lo <= self.chars_per_token <= hi:
            raise ConfigError(
                "characters per token: need 0 < min_chars_per_token <= chars_per_token <= "
                f"max_chars_per_token, got {lo}, {self.chars_per_token}, {hi}"
            )
        if self.window < 1 or self.prior_tokens < 0:
            raise ConfigError("characters per token: window >= 1, prior_tokens >= 0")


@dataclass(slots=True)
class CharsPerToken:
    """One model's learned characters per token (see the module docstring)."""

    config: TokenCountConfig = field(default_factory=TokenCountConfig)
    value: float = 0.0  # current estimate, characters per token (the prior until learned)
    observations: int = 0  # answers learned from since creation
    told: int = 0  # counts told apart from any answer (a replica's /tokenize), not answers
    _recent: deque[tuple[float, int]] = field(default_factory=deque)  # (ratio, tokens)

    def __post_init__(self) -> None:
        self.value = self.config.chars_per_token
        self._recent = deque(maxlen=self.config.window)

    def observe(self, chars: int, tokens: int, weight: int | None = None) -> None:
        """A prompt of ``chars`` characters that the replica counted as ``tokens`` tokens,
        weighing as ``weight`` tokens (default: its own)."""
        if chars <= 0 or tokens <= 0:
            return
        cfg = self.config
        if weight is None:
            self.observations += 1
        else:
            self.told += 1
        self._recent.append((chars / tokens, tokens if weight is None else max(1, weight)))
        ranked = sorted([*self._recent, (cfg.chars_per_token, cfg.prior_tokens)])
        half = sum(t for _, t in ranked) / 2
        ratio, acc = ranked[-1][0], 0
        for r, t in ranked:  # the weighted median: where half the tokens lie below
            acc += t
            if acc >= half:
                ratio = r
                break
        self.value = min(max(ratio, cfg.min_chars_per_token), cfg.max_chars_per_token)


class TokenCounts:
    """Characters per token for every model the router has seen, and the text requests in
    flight whose answers will teach them."""

    def __init__(self, config: TokenCountConfig | None = None) -> None:
        self.config = config or TokenCountConfig()
        self._models: dict[str | None, CharsPerToken] = {}
        self._pending: dict[str, tuple[str | None, int]] = {}  # request -> (model, characters)

    def chars_per_token(self, model: str | None) -> float:
        """The current estimate for ``model`` (the prior for a model not seen yet)."""
        learned = self._models.get(model)
        return learned.value if learned is not None else self.config.chars_per_token

    def estimate(self, model: str | None, chars: int) -> int:
        """Tokens in a prompt of ``chars`` characters for ``model``: at least 1 unless empty."""
        return max(1, round(chars / self.chars_per_token(model))) if chars > 0 else 0

    def models(self) -> dict[str | None, CharsPerToken]:
        """The models that have been observed, with their estimates."""
        return dict(self._models)

    def knows(self, model: str | None) -> bool:
        """Whether ``model``'s ratio has been observed at least once (or never will be: with
        learning off every model stays at the prior)."""
        learned = self._models.get(model)
        return not self.config.learn or (
            learned is not None and learned.observations + learned.told > 0
        )

    def learn(self, model: str | None, chars: int, tokens: int, weight: int | None = None) -> None:
        """``model``'s tokenizer counted ``tokens`` in ``chars`` characters of routing text:
        an answer's usage, or a count told apart from any request (a replica's ``/tokenize``:
        ``gateway/_token_probe.py``), which weighs as a prompt of ``weight`` tokens."""
        if not self.config.learn:
            return
        learned = self._models.get(model)
        if learned is None:
            learned = self._models[model] = CharsPerToken(self.config)
        learned.observe(chars, tokens, weight)

    def routed(self, request_id: str, model: str | None, chars: int) -> None:
        """A request keyed on ``chars`` characters of text was sent; its usage will tell."""
        if self.config.learn:
            self._pending[request_id] = (model, chars)

    def observe(self, request_id: str, prompt_tokens: int) -> None:
        """The replica counted ``prompt_tokens`` in ``request_id``'s prompt."""
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        model, chars = pending
        self.learn(model, chars, prompt_tokens)

    def forget(self, request_id: str) -> None:
        """The request ended (with or without usage)."""
        self._pending.pop(request_id, None)
