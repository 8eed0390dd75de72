"""Context windows: a request longer than one replica's engine can hold goes to one that can.

A fleet that mixes GPU generations often serves one model with different context windows
(vLLM's ``--max-model-len``, SGLang's ``--context-length``: a smaller GPU holds less KV, so its
window is set shorter). Such a replica answers a prompt over its window with a 400, and a
router that sends it one fails a request that another replica would have served.

* A replica's window is its ``/v1/models`` card's ``max_model_len`` (vLLM and SGLang list it),
  or, where no card gives one, what its own 400 said (:func:`window_said`).
* :func:`fitting` narrows a request's candidates to those whose window holds its prompt (the
  router's count, in tokens: exact with a tokenizer, at the model's learned characters per
  token without one) and its ``max_tokens`` (at least one token). When none does by that
  count, the largest window's replicas stay (the count may be high: the engines decide).
* A 400 that says the prompt is over the window, from a replica when another candidate's
  window is larger (:class:`OverWindow`, raised in ``_upstream_answers``), is not the client's
  answer: the request goes to a larger one, unblamed, as after a 429 (``_proxy``). Without a
  larger window known, the 400 goes to the client as it came: the request is too long for
  every replica.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prefixroute.core import ReplicaId, RequestView
from prefixroute.gateway._errors import NotFound, UpstreamError

if TYPE_CHECKING:
    from prefixroute.gateway._registry import ReplicaRegistry

# The engines' own words for a prompt over the window, lower-cased, each with its number:
# vLLM 0.32 ("This model's maximum context length is N tokens. However, your prompt contains
# M input tokens ...", "Input length (M) exceeds model's maximum context length (N).") and
# SGLang ("The input (M tokens) is longer than the model's context length (N tokens).",
# "Requested token count exceeds the model's maximum context length of N tokens. ...").
_SAID = re.compile(
    r"maximum context length (?:is |of |\()(\d+)|longer than the model's context length \((\d+)"
)


class OverWindow(UpstreamError):
    """The replica said the prompt is over its window, ``window`` tokens, before anything was
    relayed, and another candidate's window is larger (module docstring)."""

    kind = "context_window"  # the metrics' label of a request moved for it

    def __init__(self, message: str, window: int) -> None:
        super().__init__(message)
        self.window = window


def card_window(cards: Sequence[Mapping[str, Any]]) -> int | None:
    """The smallest ``max_model_len`` of the base models' cards (an adapter shares its base's
    window), tokens; None when no card gives one."""
    windows = [
        c["max_model_len"] for c in cards
        if type(c.get("max_model_len")) is int and c["max_model_len"] > 0 and not c.get("parent")
    ]  # fmt: skip
    return min(windows) if windows else None


def window_said(body: bytes) -> int | None:
    """The window a replica's 400 ``body`` says the prompt is over, tokens (None: it says no
    such thing)."""
    found = _SAID.search(body[:4096].decode("utf-8", "replace").lower())
    if found is None:
        return None
    return int(found.group(1) or found.group(2))


def needed_tokens(view: RequestView) -> int:
    """The window ``view`` needs, tokens: its prompt and at least one output token."""
    return view.prompt_tokens + max(1, view.output_tokens)


def fitting(
    registry: ReplicaRegistry, candidates: list[ReplicaId], needed: int
) -> list[ReplicaId]:
    """The ``candidates`` whose window holds ``needed`` tokens (or is unknown); when none does,
    those of the largest window (module docstring)."""
    windows = [registry.get(r).context_window for r in candidates]
    fit = [r for r, w in zip(candidates, windows, strict=True) if w is None or w >= needed]
    if len(fit) == len(candidates):
        return candidates  # (every fleet whose windows are alike, or unknown)
    if fit:
        return fit
    largest = max(w for w in windows if w is not None)
    return [r for r, w in zip(candidates, windows, strict=True) if w == largest]


def larger_window(
    registry: ReplicaRegistry, replica: ReplicaId, candidates: Sequence[ReplicaId]
) -> int:
    """The largest context window among ``candidates`` other than ``replica``, tokens (0: none
    known)."""
    larger = 0
    for r in candidates:
        w = registry.get(r).context_window
        if r != replica and w is not None and w > larger:
            larger = w
    return larger


def learned_window(registry: ReplicaRegistry, replica: ReplicaId, window: int) -> None:
    """``replica`` said its window is ``window`` tokens: later requests that need more go
    elsewhere at once (unless it has left the registry meanwhile). Not where its own card
    gives its window: engines quote the client's values in their 400s, and a request that put
    "maximum context length is 1" in one (vLLM: ``value=...``) took the replica out of
    rotation until the next card refresh (an outside audit, 2026-12-07)."""
    with contextlib.suppress(NotFound):
        record = registry.get(replica)
        if card_window(record.model_cards) is None:
            record.context_window = window
