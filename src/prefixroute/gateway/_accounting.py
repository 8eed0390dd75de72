"""The end of one attempt's accounting, and a plain answer's first token guessed meanwhile.

A stream's first event is its measured first token (``_relay``). A plain answer shows none: it
arrives whole, at the end of decoding. Counted as prefilling until then, it would look like
queued prefill work for all of its decode, and the first tokens of the streams sent behind it
would look to have waited for less than that queue: the speed model took the difference for a
faster replica. With half the answers plain, on a fleet whose replicas prefill at 20,000 and
5,000 tokens/s, the simulator's router learned 60,000-200,000 (its bound) for the fast pair.
So, as the Ray router does, the first token of a plain answer is guessed when it is due
(``Router.first_token_due``: at the replica's learned speed, behind the queue it joined), and
again later while the requests ahead of it on that replica are not through
(``Router.guess_first_token``, core/plain_answers.py); the answer's end then teaches both its
prefill and its decode (``Router.complete(..., whole=True)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prefixroute.core import Router
from prefixroute.gateway._listener import RouteListener
from prefixroute.gateway._usage import Usage


class FirstTokenGuess:
    """The timer of a plain answer's guessed first token (module docstring): due at the
    replica's learned speed, then again as long as the router says requests ahead of it are
    not through (``Router.guess_first_token``). Cancel it when the answer ends."""

    def __init__(
        self,
        router: Router,
        listener: RouteListener | None,
        rid: str,
        due: float,
        clock: Callable[[], float],
    ) -> None:
        self.router, self.listener, self.rid, self.clock = router, listener, rid, clock
        self._handle = asyncio.get_running_loop().call_later(due, self._due)

    def _due(self) -> None:
        again = self.router.guess_first_token(self.rid, self.clock())
        if again is not None:
            self._handle = asyncio.get_running_loop().call_later(again, self._due)
        elif self.listener is not None:
            self.listener.first_token(self.rid)

    def cancel(self) -> None:
        self._handle.cancel()


def guess_first_token(
    router: Router,
    listener: RouteListener | None,
    rid: str,
    clock: Callable[[], float] = time.monotonic,
) -> FirstTokenGuess | None:
    """On the running loop, guess the first token of the plain answer ``rid`` for the router
    (and ``listener``) when it is due (:class:`FirstTokenGuess`); None: no guess (its replica's
    speed is not its own yet)."""
    due = router.first_token_due(rid)
    return None if due is None else FirstTokenGuess(router, listener, rid, due, clock)


class Release:
    """The call that ends ``rid``'s accounting: at the upstream's end, or in ``finally``,
    whichever comes first (the second call does nothing). With the replica's ``usage``, the
    router learns from it: the uncached tokens it really computed, and its output. Made right
    after the request is routed; ``plain``: the client asked for no stream (module docstring)."""

    def __init__(
        self, router: Router, listener: RouteListener | None, rid: str, plain: bool
    ) -> None:
        self.router = router
        self.listener = listener
        self.rid = rid
        self.plain = plain
        self.learns = True  # False: its usage is not its own (a stored response's fetch: _proxy)
        self.settle: Callable[[Usage], None] | None = None  # the tenant's charge, set right
        self.done = False
        self._guess = guess_first_token(router, listener, rid) if plain else None

    def __call__(self, usage: Usage | None = None) -> None:
        """End the accounting now (a failed attempt: the request may be routed again under the
        same id, so its end must come before that)."""
        self._end(usage, later=False)

    def after_answer(self, usage: Usage | Callable[[], Usage | None] | None = None) -> None:
        """End it once the answer's last bytes are on their way: a client does not wait for
        what the router learns from the answer (the speed model refits every few answers). The
        end's time is taken now; only the router's work waits for the loop's next turn (with
        ``usage`` read then, when it is given as the call that reads it). For answers that
        went out, never retried, so nothing is routed under this id meanwhile."""
        self._end(usage, later=True)

    def _end(self, usage: Usage | Callable[[], Usage | None] | None, later: bool) -> None:
        if self.done:
            return
        self.done = True
        if self._guess is not None:
            self._guess.cancel()
        if later:
            asyncio.get_running_loop().call_soon(self._learn, usage, time.monotonic())
        else:
            self._learn(usage, time.monotonic())

    def _learn(self, usage: Usage | Callable[[], Usage | None] | None, now: float) -> None:
        usage = usage() if callable(usage) else usage
        if not self.learns:
            usage = None
        if usage is not None and self.settle is not None:
            self.settle(usage)
        # A plain answer read whole, with its usage: its time covers prefill and decode.
        whole = self.plain and usage is not None
        end(self.router, self.listener, self.rid, now, usage, whole)


def end(
    router: Router,
    listener: RouteListener | None,
    rid: str,
    now: float,
    usage: Usage | None,
    whole: bool,
) -> None:
    """``rid`` ended at ``now``: the router learns from the replica's ``usage`` (the uncached
    tokens it really computed, its output; a plain answer's whole time, with ``whole``) and
    ``listener`` hears of the end."""
    output = None
    if usage is not None:
        if usage.prompt_tokens is not None:  # chars per token, even without cached tokens
            router.observe_usage(rid, usage.prompt_tokens, usage.cached_tokens)
        output = usage.completion_tokens
    router.complete(rid, now, output, whole=whole)
    if listener is not None:
        listener.completed(rid)
