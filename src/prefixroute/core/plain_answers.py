"""A guessed first token waits its turn: the rule behind ``Router.guess_first_token``.

A plain (non-streamed) answer shows no first token, so the router guesses one when it is due
at its replica's learned speed, behind the queue the request joined (``first_token_due``).
Guessed once, at dispatch, that time cannot see what happens afterwards. When a replica falls
behind its prediction (its running batch grew, the decodes slowed every step), the guesses
still came on time, the load view emptied its queue while the engine still held it, the
router kept sending there, and the next guesses came early by even more. On four equal
replicas with half the answers plain, hot-prefix seed 0 in the simulator, the guesses on the
prefix's home came up to 1.5 s before the real first tokens and its p99 TTFT went from 548 ms
(every answer streamed) to 2.2 s.

Engines admit their waiting requests in arrival order (vLLM's and SGLang's default first-come,
first-served), so a request's first token does not come before those of the requests sent to
the same replica ahead of it. A guess that finds one of them still without a first token (seen,
heard from another instance, or guessed itself) is not taken: the caller asks again after the
time the work still ahead of it should take, and so on until that work is through.

The same order says more. A first token seen on a request sent after a plain answer says the
engine is past that answer's prefill too, guessed or not: it is taken as come then. That matters
most before a replica's speed is its own, when no guess is made: the plain answers then stayed
counted as queued until they ended, the streams sent behind them seemed to have waited for that
work, and the speed model took a replica for faster than it was. On four equal replicas
(10,000 tokens/s) with half the answers plain, the simulator's no-sharing seed 1 warmed one up
at 39,000 tokens/s, and its queue grew to 3.5 s while the router saw 0.85 s.

A queue the engine reorders (SGLang's longest-prefix-match policy, priorities) makes both rules
less exact: a guess can only come later (its request stays counted as queued, which sends its
replica less, never more), and a plain answer taken as come by a later stream may still be
prefilling, as a stream's own first token may come out of order.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the load view imports this module
    from prefixroute.core.inflight import InFlight
    from prefixroute.core.load import LoadTracker
    from prefixroute.core.replica_load import ReplicaLoad

# The shortest wait before guessing again, seconds: when the work ahead is all cached and the
# replica is not decoding, the prediction is zero, and asking again at once would spin.
MIN_RECHECK_S = 0.001
# The longest, once the work ahead is overdue by the model: the wait doubles from the shortest
# at each guess put off, up to this. Behind a request whose first token does not come (routed
# by Ray and not sent yet, another instance's whose news was lost) a guess was asked again
# every millisecond until that request ended, or was taken as silent 30 s later (a review).
MAX_RECHECK_S = 0.1


def in_order(load: ReplicaLoad, req: InFlight) -> None:
    """``req`` was just sent to the replica whose load is ``load``: it joins the order. The
    prefilled requests leave from the front as they pass, and all at once when they outnumber
    the requests still waiting: behind one that never gets a first token (a stream that hangs,
    another instance's request whose end was lost), the order would grow with every request
    sent there until it ends, or expires ten minutes later."""
    ahead = _from_first_waiting(load)
    if len(ahead) > 2 * load.prefilling + 8:
        load.unprefilled = ahead = deque(other for other in ahead if not other.prefilled)
    ahead.append(req)


def _from_first_waiting(load: ReplicaLoad) -> deque[InFlight]:
    """``load``'s order, its prefilled requests at the front dropped."""
    ahead = load.unprefilled
    while ahead and ahead[0].prefilled:
        ahead.popleft()
    return ahead


def waiting_before(req: InFlight) -> list[InFlight]:
    """The requests sent to ``req``'s replica before it that have no first token yet, oldest
    first."""
    ahead = _from_first_waiting(req.load)
    before = itertools.takewhile(lambda other: other.seq < req.seq, ahead)
    return [other for other in before if not other.prefilled]


def passed_unseen(seen: InFlight) -> list[InFlight]:
    """The requests sent to ``seen``'s replica before it, still without a first token, whose
    first token nobody will see: ``seen``'s first token came, so theirs did (module
    docstring)."""
    return [other for other in waiting_before(seen) if other.unseen]


def recheck_s(req: InFlight, now: float) -> float | None:
    """None when ``req``'s guessed first token can be taken at ``now``; else how long the work
    still ahead of it on its replica should take, from ``now``, at the replica's learned speed
    (at least ``MIN_RECHECK_S``), seconds: when to ask again (module docstring)."""
    waiting = waiting_before(req)
    if not waiting:
        return None
    tokens = sum(other.uncached_tokens for other in waiting)
    context = sum(other.context for other in waiting)
    load = req.load
    speed = load.speed
    elapsed = now - load.busy_since
    work, steps, context = speed.queue_work(
        tokens, elapsed, load.decoding > 0, req.uncached_tokens, context, req.context
    )
    wait = speed.prefill_s(work, context) + steps * speed.decode_step_s
    if wait >= MIN_RECHECK_S:
        return wait
    req.rechecks += 1  # overdue: back off (MAX_RECHECK_S)
    return min(MAX_RECHECK_S, MIN_RECHECK_S * 2.0 ** min(req.rechecks - 1, 16))


class PlainAnswerCalls:
    """The :class:`~prefixroute.core.router.Router`'s calls for an answer whose first token
    nobody will see: when it is due, and its guess (the ``Router`` docstring shows the order)."""

    loads: LoadTracker

    def first_token_due(self, request_id: str) -> float | None:
        """Seconds after its dispatch that the request's first token is predicted, at its
        replica's learned speed (None: not in flight, past its prefill, or its replica's
        speed is not its own yet): when to call :meth:`guess_first_token`."""
        return self.loads.first_token_due(request_id)

    def guess_first_token(self, request_id: str, now: float) -> float | None:
        """Take the request's first token as come at ``now``, unseen: its replica's queue no
        longer counts its prefill, and the speed model learns nothing from the time. None once
        taken; seconds to wait before calling again while requests sent to its replica before
        it still have no first token (module docstring)."""
        return self.loads.guess_first_token(request_id, now)
