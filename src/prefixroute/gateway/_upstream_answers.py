"""What a replica's answer means before any byte of it reaches the client.

Most answers go to the client as they came. Three do not, when another replica may take the
request instead:

* a 5xx (:class:`Status5xx`): retried once elsewhere, and judged (``_verdict``);
* a busy replica's answer (:class:`ReplicaBusy`, ``busy_answer``): a 429 (TGI's when it is
  overloaded, vLLM's and llm-d's queue limits), or SGLang's 503 "The request queue is full."
  (its ``--max-queued-requests`` overflow; "aborted by a higher priority request" under
  priority scheduling), which a stream carries in-band as its first event after a 200
  (``_relay``). The replica is full, not broken: the request goes to another replica, as
  often as there are others to try, and the replica is not blamed. With nowhere else to go
  the answer is relayed as it came, its ``Retry-After`` with it, and still blames no one
  (``RelayResult.busy``: ``_verdict``). A full SGLang's 503s were
  retried once as failures and blamed, and its streams failed in-band to the client (the
  SGLang audit, 2026-12-07);
* a 400 that refuses the ``stream_options`` the gateway added (:class:`UsageRefused`): sent
  again as the client sent it (``Proxy._attempt``);
* a 400 that says the prompt is over the replica's context window, when another candidate's
  window is larger (``_context_window.OverWindow``): the request goes there, unblamed.
"""

from __future__ import annotations

import aiohttp

from prefixroute.gateway._context_window import OverWindow, window_said
from prefixroute.gateway._errors import AnswerTimeout, UpstreamError
from prefixroute.gateway._failures import failure_kind
from prefixroute.gateway._usage import refuses_stream_options

BUSY = 429  # Too Many Requests: the replica's queue is full
# What SGLang says when it is full, not broken (scheduler.py's _abort_on_queued_limit: a 503,
# and in a stream whatever code its serving layer gives the error event): read at any status.
_FULL = (b"the request queue is full", b"aborted by a higher priority request")
ANSWER_TIMEOUT = "answer_timeout"  # a plain answer silent past read_timeout_s (AnswerTimeout)


class Status5xx(UpstreamError):
    """The replica answered 5xx before anything was relayed (retryable)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ReplicaBusy(UpstreamError):
    """The replica answered 429 before anything was relayed: another replica may take it."""

    kind = "busy"  # the metrics' label of a request moved for it


class UsageRefused(Exception):
    """The replica refused the ``stream_options`` the gateway added (``Proxy._attempt``)."""


async def not_for_the_client(
    resp: aiohttp.ClientResponse, usage_asked: bool, can_retry: bool, can_move: bool, name: str,
    larger_window: int = 0,
) -> None:  # fmt: skip
    """Raise for an answer the client must not get (module docstring). ``can_retry``: a
    failure may be retried elsewhere; ``can_move``: there is another replica to try at all;
    ``larger_window``: the largest context window among the other candidates, tokens (0: none
    known; ``_context_window.larger_window``)."""
    if usage_asked and resp.status == 400 and refuses_stream_options(await resp.read()):
        raise UsageRefused
    if resp.status == 400 and larger_window:
        window = window_said(await resp.read())
        if window is not None and window < larger_window:
            raise OverWindow(f"the prompt is over replica {name}'s window ({window})", window)
    if can_move and resp.status >= 400 and busy_answer(resp.status, await resp.read()):
        raise ReplicaBusy(f"replica {name} is busy ({resp.status})")  # (its body read: pooled)
    if resp.status >= 500 and can_retry:
        raise Status5xx(f"replica {name} answered {resp.status}", resp.status)


def busy_answer(status: int, body: bytes) -> bool:
    """Whether an answer (or a stream's first in-band error) of ``status`` saying ``body`` is
    a full replica's (module docstring)."""
    return status == BUSY or (status >= 400 and any(w in body.lower() for w in _FULL))


def kind_of(exc: BaseException) -> str:
    """The failure kind of a failed attempt (a metrics label value); a busy replica's is
    ``busy``, counted where it is caught (``Proxy._attempts``)."""
    if isinstance(exc, Status5xx):
        return "status"
    if isinstance(exc, AnswerTimeout):
        return ANSWER_TIMEOUT
    cause = exc.__cause__
    return failure_kind(cause) if cause is not None else "error"
