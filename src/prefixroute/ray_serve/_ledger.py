"""The core Router plus what Ray's hooks tell us about each request, kept consistent.

The gateway sends a request where the router decided and learns how it ended in one place.
Under Ray the same request passes through several hooks, on Ray's schedule:

1. ``choose_replicas`` asks us to rank the replicas. We decide and record the decision at once
   (index insert, load dispatch), as the gateway does: stage ``ROUTED``.
2. Ray picks a replica from our ranks: ours when it has room under ``max_ongoing_requests``,
   otherwise the least busy of the rest. The request's future resolves with that replica
   (or is cancelled): stage ``SENT``. If Ray picked another replica than ours, the request is
   recorded again there (a reused request id releases the earlier dispatch, so it is counted
   once), and the index learns where the prompt really went.
3. A replica at its limit may reject the request; Ray then calls ``choose_replicas`` again for
   the same request, which routes it again (back to ``ROUTED``) after withdrawing what the
   attempt before added to the index: the replica that rejected it, or that Ray never sent
   it to (no room anywhere: Ray backed off and asked again), computed none of it.
4. ``on_request_completed`` fires once per attempt that was sent, accepted or not, on Ray's
   event loop. It releases the load only for the attempt we believe is running: the stage must
   be ``SENT`` on that replica. A rejected attempt whose notice arrives after its retry was
   routed is ignored, because the retry's dispatch already replaced it. (Only a notice that
   arrives after the retry was also *sent*, to the same replica, would release the retry
   early; Ray schedules the notice when it cancels the rejected attempt, before it retries.)

What a replica never received leaves the index again (:meth:`Router.withdraw`, the blocks the
decision added there): our choice when Ray overrode it, an attempt that was rejected or never
sent, and a request given up before it was sent. A rejected attempt is told from an accepted one
by ``on_request_routed``, which Ray calls for an accepted attempt before its completion notice
can come: a notice for an attempt never accepted is a rejection. Ray sends without the protocol
in some setups (strict ``max_ongoing_requests`` off, Ray Client, Java replicas), where no
attempt is ever accepted: so a notice counts as a rejection only once this ledger has seen an
acceptance. Otherwise the index would go on saying that
replica holds the prompt, and the prefix's next requests would be sent there, predicted cheap,
to be computed in full (before 2026-12-02 it did). The Redis sync hears each withdrawal too.

Ray never shows the router a request's first token, only its end. Counted as prefilling until
it ends, a request that is long done with its prefill and decoding would look like queued
prefill work, and the policies would shun the replica holding a conversation's cache while it
answers the previous turn. So when the request is sent, the ledger predicts its first token as
the policy does, after the prefill queued on that replica (its own included): at the speed the
replica told in its routing stats (``Router.first_token_due``, as the gateway guesses a plain
answer's first token), else at ``prefill_tokens_per_s``. The router calls :meth:`prefilled` then,
and again while requests sent to that replica before it are not through: engines admit in
arrival order (``Router.guess_first_token``, core/plain_answers.py). ``None`` turns this off:
every request then counts as prefilling until it completes.

Ray's hooks run on its router loop, but a request's future may belong to the caller's loop,
in another thread. A lock makes every method safe from any thread: cheap next to a routing
decision, and it keeps the core Router's single-threaded contract. The Redis sync, when on,
calls the router with the same lock held (:attr:`Ledger.lock`).

A :class:`LedgerListener` hears each change as the router records it (a decision, including a
re-recording where Ray overrode us, a predicted first token, an end), in the order they were
made: the Redis sync (``_sync``) shares them with the other routers, as the gateway's proxy does.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from prefixroute.core import (
    SPEED_PRIOR_KEYS,
    ConfigError,
    Decision,
    ReplicaId,
    RequestView,
    RouteKey,
    Router,
    SpeedPrior,
)

log = logging.getLogger(__name__)


class Stage(StrEnum):
    ROUTED = "routed"  # decided and recorded; Ray has not sent it yet
    SENT = "sent"  # Ray sent it to ``Flight.replica``


@dataclass(slots=True)
class Flight:
    view: RequestView  # hashed once, reused by every attempt
    replica: ReplicaId  # where the router's records put the request now
    stage: Stage
    attempt: int = 0  # this routing's number, unique in the ledger; a prefill timer names it
    accepted: bool = False  # the replica said it took this attempt (Ray's rejection protocol)
    watched: object = None  # the future whose outcome we follow (one callback per future)


@dataclass(frozen=True, slots=True)
class PrefillEstimate:
    """When to call :meth:`Ledger.prefilled` for a request just sent."""

    request_id: str
    attempt: int  # the attempt it was predicted for; a later attempt ignores it
    delay_s: float  # predicted time to the first token from now, seconds


class LedgerListener(Protocol):
    """Hears what the router records about each request; called with the ledger's lock held,
    from any thread, so each method must return at once and never raise."""

    def routed(self, view: RequestView, decision: Decision) -> None: ...
    def withdrawn(self, request_id: str) -> None: ...
    def first_token(self, request_id: str) -> None: ...
    def completed(self, request_id: str) -> None: ...


class Ledger:
    """Routes requests with a core Router and follows them through Ray's hooks."""

    listener: LedgerListener | None = None  # the Redis sync, when on (set once, before use)

    def __init__(
        self,
        router: Router,
        clock: Callable[[], float] = time.monotonic,
        prefill_tokens_per_s: float | None = None,
    ) -> None:
        self.router = router
        self.clock = clock  # seconds; the core takes the time as an argument
        self.prefill_tokens_per_s = prefill_tokens_per_s  # tokens/s; None: no first-token guess
        self._flights: dict[str, Flight] = {}
        self._lock = threading.Lock()
        self._acceptances = False  # an attempt was accepted: Ray runs the rejection protocol
        # Replicas whose reported speed priors were read: True where they gave a prefill rate
        # that the router took (the first-token guess is then at it: ``sent``).
        self._told: dict[ReplicaId, bool] = {}
        # Attempts are numbered across the ledger, not per request: a retry whose request's
        # record ended before it (a rejection notice first) starts a new record, and a timer
        # of the rejected attempt, numbered per request, named it too (the review, 2026-12-07).
        self._attempts = itertools.count(1)

    @property
    def lock(self) -> threading.Lock:
        """Held around every call into the router; anyone else calling it must hold it too."""
        return self._lock

    # --- replicas -------------------------------------------------------------------------
    def sync(self, replicas: Collection[ReplicaId]) -> None:
        """Make the router's replicas exactly ``replicas`` (Ray's ``update_replicas``)."""
        with self._lock:
            wanted = set(replicas)
            for gone in [r for r in self.router.replicas if r not in wanted]:
                self.router.remove_replica(gone)
                self._told.pop(gone, None)
            for replica in replicas:
                self.router.add_replica(replica)

    def remove(self, replica: ReplicaId) -> None:
        """Forget a replica whose actor died, and what it cached."""
        with self._lock:
            self.router.remove_replica(replica)
            self._told.pop(replica, None)

    def observe(self, replica: ReplicaId, stats: Mapping[str, object]) -> None:
        """Numbers a replica reports about itself (``record_routing_stats``), when it does:
        its load, and its own speed priors (``prefill_tokens_per_s``, ``decode_step_s``: a
        deployment that knows its GPU), taken while its speed is not its own yet."""

        def number(name: str) -> float | None:
            # A NaN, an infinity or a negative count is no reading (round() of one raised, and
            # failed every request of the handle until the next poll), as on a metrics page.
            value = stats.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value) if 0.0 <= value < math.inf else None

        self._tell_speed(replica, {k: stats[k] for k in SPEED_PRIOR_KEYS if k in stats})
        running, waiting, usage = number("num_running"), number("num_waiting"), number("kv_usage")
        if running is None and waiting is None and usage is None:
            return
        with self._lock:
            if self.router.has_replica(replica):
                self.router.observe_replica(
                    replica,
                    kv_usage=usage,
                    num_waiting=None if waiting is None else round(waiting),
                    num_running=None if running is None else round(running),
                )

    def _tell_speed(self, replica: ReplicaId, given: Mapping[str, object]) -> None:
        """Read once per replica (it repeats them at every poll), once the router has it."""
        if not given or replica in self._told:
            return
        with self._lock:
            if not self.router.has_replica(replica):
                return  # reported before Ray's update_replicas reached us: at the next poll
            self._told[replica] = False
            try:
                taken = self.router.tell_speed(replica, SpeedPrior.from_mapping(given))
                self._told[replica] = taken and "prefill_tokens_per_s" in given
            except ConfigError as exc:
                log.warning("replica %s: speed priors %s ignored: %s", replica, given, exc)

    # --- requests -------------------------------------------------------------------------
    def route(self, request_id: str, key: RouteKey, candidates: Sequence[ReplicaId]) -> Decision:
        """Decide among ``candidates`` and record it (a retry routes the same request again)."""
        with self._lock:
            for replica in candidates:  # a replica Ray knows before update_replicas reached us
                self.router.add_replica(replica)
            flight = self._flights.get(request_id)
            if flight is not None:  # a retry: the attempt before was rejected, or never sent
                self._withdraw(request_id)
            view = key.view(self.router, request_id) if flight is None else flight.view
            decision = self.router.route(view, self.clock(), candidates)
            if self.listener is not None:
                self.listener.routed(view, decision)
            if flight is None:
                flight = self._flights[request_id] = Flight(view, decision.replica, Stage.ROUTED)
            else:
                flight.replica, flight.stage = decision.replica, Stage.ROUTED
                flight.accepted = False
            flight.attempt = next(self._attempts)
            return decision

    def watch(self, request_id: str, future: object) -> bool:
        """True the first time ``future`` is seen for the request: follow it then, once."""
        with self._lock:
            flight = self._flights.get(request_id)
            if flight is None or flight.watched is future:
                return False
            flight.watched = future
            return True

    def sent(
        self, request_id: str, replica: ReplicaId, accepted: bool = False
    ) -> PrefillEstimate | None:
        """Ray sent the request to ``replica``: ours, or another if ours had no room;
        ``accepted``: the replica said it took it (``on_request_routed``).

        Returns when its first token is expected, the first time Ray reports the send.
        """
        with self._lock:
            flight = self._flights.get(request_id)
            if accepted:
                self._acceptances = True
                if flight is not None and flight.replica == replica:
                    flight.accepted = True
            if flight is None or (flight.stage is Stage.SENT and flight.replica == replica):
                return None
            if replica != flight.replica:  # ours had no room: it never got the prompt
                self._withdraw(request_id)
                self.router.add_replica(replica)
                decision = self.router.route(flight.view, self.clock(), [replica])
                if self.listener is not None:
                    self.listener.routed(flight.view, decision)
                flight.replica = replica
                flight.accepted = accepted
            flight.stage = Stage.SENT
            rate = self.prefill_tokens_per_s
            if rate is None:
                return None
            # At the replica's own speed where it told its rate (its routing stats), as the
            # gateway guesses a plain answer's; else at the settings' rate (module docstring). A
            # decode step alone was told: the model's rate was then the policy's prior, not ours.
            due = self.router.first_token_due(request_id)  # (which also marks it unseen)
            if due is None or not self._told.get(replica, False):
                queued = self.router.replica_load(replica).queued_prefill_tokens  # ours too
                due = queued / rate
            return PrefillEstimate(request_id, flight.attempt, due)

    def prefilled(self, request_id: str, attempt: int) -> float | None:
        """The predicted first token of ``attempt`` is due (see :class:`PrefillEstimate`).
        Returns the seconds after which to call again, while requests sent to its replica
        before it are not through (``Router.guess_first_token``); else None."""
        with self._lock:
            flight = self._flights.get(request_id)
            if flight is None or flight.attempt != attempt or flight.stage is not Stage.SENT:
                return None
            again = self.router.guess_first_token(request_id, self.clock())
            if again is None and self.listener is not None:
                self.listener.first_token(request_id)
            return again

    def cancelled(self, request_id: str) -> None:
        """The request was given up before Ray sent it anywhere."""
        with self._lock:
            flight = self._flights.get(request_id)
            if flight is not None and flight.stage is Stage.ROUTED:
                del self._flights[request_id]
                self._withdraw(request_id)
                self._complete(request_id)

    def completed(self, request_id: str, replica: ReplicaId) -> bool:
        """An attempt on ``replica`` ended; True if it was the one counted in flight."""
        with self._lock:
            flight = self._flights.get(request_id)
            if flight is None or flight.stage is not Stage.SENT or flight.replica != replica:
                return False
            del self._flights[request_id]
            if self._acceptances and not flight.accepted:  # rejected (module docstring)
                self._withdraw(request_id)
            self._complete(request_id)
            return True

    def _withdraw(self, request_id: str) -> None:
        """The replica the request was last routed to never computed it (lock held)."""
        self.router.withdraw(request_id)
        if self.listener is not None:
            self.listener.withdrawn(request_id)

    def _complete(self, request_id: str) -> None:
        """End ``request_id``'s accounting (lock held)."""
        self.router.complete(request_id, self.clock())
        if self.listener is not None:
            self.listener.completed(request_id)

    # --- introspection --------------------------------------------------------------------
    def follows(self, request_id: str) -> bool:
        """``request_id`` is routed and not yet completed or cancelled."""
        with self._lock:
            return request_id in self._flights

    @property
    def pending(self) -> int:
        """Requests routed and not yet completed or cancelled."""
        return len(self._flights)

    def in_flight(self, replica: ReplicaId) -> int:
        with self._lock:
            known = self.router.has_replica(replica)
            return self.router.replica_load(replica).in_flight if known else 0
