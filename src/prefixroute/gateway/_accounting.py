"""The end of one attempt's accounting, and a plain answer's first token guessed meanwhile.

A stream's first event is its measured first token (``_relay``). A plain answer shows none: it
arrives whole, at the end of decoding. Counted as prefilling until then, it would look like
queued prefill work for all of its decode, and the first tokens of the streams sent behind it
would look to have waited for less than that queue: the speed model took the difference for a
faster replica. With half the answers plain, on a fleet whose replicas prefill at 20,000 and
5,000 tokens/s, the simulator's router learned 60,000-200,000 (its bound) for the fast pair.
So, as the Ray router does, the first token of a plain answer is guessed when it is due
(``Router.first_token_due``: at the replica's learned speed, behind the queue it joined) and
told to the router as unmeasured; the answer's end then teaches both its prefill and its
decode (``Router.complete(..., whole=True)``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from prefixroute.core import Router
from prefixroute.gateway._listener import RouteListener
from prefixroute.gateway._usage import Usage


def guess_first_token(
    router: Router,
    listener: RouteListener | None,
    rid: str,
    clock: Callable[[], float] = time.monotonic,
) -> asyncio.TimerHandle | None:
    """On the running loop, tell the router (and ``listener``) the first token of the plain
    answer ``rid`` when it is due, as unmeasured (module docstring); None: no guess (its
    replica's speed is not its own yet). Cancel the handle when the answer ends."""
    due = router.first_token_due(rid)
    if due is None:
        return None

    def guessed() -> None:
        router.first_token(rid, clock(), measured=False)
        if listener is not None:
            listener.first_token(rid)

    return asyncio.get_running_loop().call_later(due, guessed)


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
        self.done = False
        self._guess = guess_first_token(router, listener, rid) if plain else None

    def __call__(self, usage: Usage | None = None) -> None:
        if self.done:
            return
        self.done = True
        if self._guess is not None:
            self._guess.cancel()
        # A plain answer read whole, with its usage: its time covers prefill and decode.
        whole = self.plain and usage is not None
        end(self.router, self.listener, self.rid, time.monotonic(), usage, whole)


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
