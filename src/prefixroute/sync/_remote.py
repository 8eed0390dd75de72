"""The other instances' messages, applied to this instance's router (``_sync``).

A decision goes to the router as :meth:`Router.remote_routed`: an index entry in approximate
mode, a speculative entry in precise mode (whose index follows the engines' KV events, which
every instance hears). A live decision that names its request also counts that request in the
load view (:meth:`Router.remote_dispatch`) until its progress messages say its first token came
and it ended: without that, each instance sees only a third of the load behind a three-way
balancer, and all of them pile a conversation's turns onto the replica that holds it. A counted
request's blocks are kept by its key, and its instance's word that the replica turned it away
takes them back out here too (:meth:`Router.withdraw`). The history replays index entries, never
load: those requests are long over; a decision withdrawn later is left out of the replay
(:func:`without_withdrawn`). The replica of another instance's stored Responses answer goes to
``on_stored``, the front end's map (``gateway/_responses.py``), live or replayed.

A remote request whose end never arrives is dropped after ``REMOTE_TTL_S``, and all of them are
dropped when the subscription breaks, since their progress messages are lost meanwhile. An
instance that dies (``kill -9``, a lost node) sends no ends: every instance says it is alive
at least every ``ALIVE_EVERY_S`` (an empty progress message, which instances that predate it
apply as the end of no request), and the requests of an instance not heard for
``SILENT_S`` are dropped. Before, a crashed instance's requests stayed counted on every other
for ten minutes, pushing traffic off the replicas they named (an outside audit, 2026-12-06).

With signed messages (``sync_secret``), a live decision counts as load only if it was sent
within ``FRESH_S`` of our clock (``Routed.sent_at``) and its request's end has not been heard:
the history holds thousands of signed decisions, and sent again on the channel each would count
its long-finished request for ``REMOTE_TTL_S``. Instances' clocks must then agree within
``FRESH_S`` (NTP does, by far). An instance that predates ``sent_at`` sends 0: behind a
secret its counted decisions are skipped (``prefixroute_sync_skipped_total{reason="replayed"}``)
until it is upgraded too.

Each heartbeat also says how many of its instance's counted requests have not ended, and the
requests we count of it beyond that are dropped, those sent longest ago first: its messages come
in order, so only lost ends, or decisions sent again after their ends to an instance that never
heard the ends, leave more. With signed messages a heartbeat is numbered and timed: one sent
again, or sent more than ``FRESH_S`` from our clock, is no sign of life (nor are decisions and
ends, which can be sent again), so a dead instance's recorded heartbeats cannot keep its
requests counted (an outside audit, 2026-12-07). A decision not counted for a replay still
enters the index: dropped whole, a clock a minute off lost every shared prefix, unsaid.

A router that other threads also call (Ray Serve's, whose hooks come from more than one thread)
passes the lock that guards it: every call into the router here is made holding it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import msgspec

from prefixroute.core import BlockHasher, ReplicaId, Router
from prefixroute.sync._metrics import SyncMetrics
from prefixroute.sync._wire import Message, Progress, Routed, Stored, Withdrawn, decode

log = logging.getLogger(__name__)

# Where another instance's stored Responses answer is noted: (tenant, response id, replica).
StoredHook = Callable[[str | None, str, ReplicaId], None]

REMOTE_TTL_S = 600.0  # a remote request not heard of for this long is taken as over, seconds
# Each instance says it is alive at least this often, seconds: about 30 bytes a second to each
# other instance, so that a killed one's requests stop taking their replicas' room (and their
# in-flight cap) soon. It was 5 s, and a killed instance's requests held the cap for 30 s.
ALIVE_EVERY_S = 1.0
# An instance not heard for this long is gone, seconds: ten heartbeats missed in a row, which a
# live instance's event loop or Redis's delivery does not fall behind by.
SILENT_S = 10 * ALIVE_EVERY_S
INSTANCES = 4096  # instances remembered as heard; past this the table starts over
UNKNOWN_SAID = 16  # unknown replicas warned of, at most
EXPIRE_EVERY_S = 1.0  # how often remote requests are checked for expiry, seconds
# How far a signed decision's ``sent_at`` may be from our clock for it to count as load,
# either way, seconds: far above Redis's delivery time and NTP-synced clocks' skew, far below
# REMOTE_TTL_S, for which a replayed decision would otherwise hold its replica's load up.
FRESH_S = 60.0


def hashing_keys(hasher: BlockHasher) -> str:
    """How ``hasher`` cuts and hashes prompts, in a few characters: its block size and its
    hash of a fixed probe (the seed and the function). Two instances that differ here share
    no block hash, so each one's decisions are of no use to the other."""
    return f"{hasher.block_size}:{hasher.hash_fn(b'prefixroute sync', hasher.seed):016x}"


def _first_of(said: set[str], key: str) -> bool:
    """True the first time ``key`` is to be said, while ``said`` holds fewer than
    ``UNKNOWN_SAID`` (a peer may name new ones at will): a warning once per key, a few."""
    if key in said or len(said) >= UNKNOWN_SAID:
        return False
    said.add(key)
    return True


def _wall_clock() -> float:  # the clock decisions' sent_at is read against (tests set it)
    return time.time()


class RemoteRequests:
    """Applies the others' messages, and keeps the others' requests this router counts."""

    def __init__(
        self,
        router: Router,
        instance_id: str,
        metrics: SyncMetrics,
        share_load: bool = True,
        lock: AbstractContextManager[Any] | None = None,
        fresh_only: bool = False,
    ) -> None:
        self.router = router
        self.lock = nullcontext() if lock is None else lock  # held around every router call
        self.instance_id = instance_id  # ours: messages naming it are our own, heard back
        self.metrics = metrics
        self.share_load = share_load  # count the others' requests in the load view
        self.on_stored: StoredHook | None = None  # the front end's map of stored responses
        # "instance/request id" -> when dispatched (time.monotonic()), oldest first, for expiry
        self._remote: dict[str, float] = {}
        # Signed messages (module docstring): only fresh decisions count as load, and each
        # decision once: "instance/request id" -> (when its end came, monotonic; the sent_at of
        # the decision it ended), oldest first. A later decision of that id (a retry of the
        # request on another replica after its first attempt ended) is no replay: it counts.
        self.fresh_only = fresh_only
        self._ended: dict[str, tuple[float, float]] = {}
        self._sent_at: dict[str, float] = {}  # a counted request's decision's sent_at
        self._expired_at = 0.0  # last expiry pass, time.monotonic()
        self._heard: dict[str, float] = {}  # instance -> last message from it, monotonic
        self._seq: dict[str, int] = {}  # instance -> its last heartbeat's number heard
        self._clock_said: set[str] = set()  # instances whose decisions came from far off
        self.keys = hashing_keys(router.hasher)  # how we hash prompts, told in our heartbeats
        self._other_keys: dict[str, str] = {}  # instances that hash otherwise: their keys
        self._unknown_said: set[str] = set()  # replicas named by others we do not know
        metrics.remote_in_flight.set_function(lambda: len(self._remote))

    def __len__(self) -> int:
        """The others' requests counted in the load view now."""
        return len(self._remote)

    def instances(self) -> int:
        """Other instances heard within ``SILENT_S``: those sharing with this one now."""
        now = time.monotonic()
        return sum(1 for at in self._heard.values() if now - at <= SILENT_S)

    def apply(self, payload: bytes, live: bool = True) -> bool:
        """Apply another instance's message; False when skipped (ours, unknown, undecodable).

        ``live`` is False for the history: its decisions go into the index, and neither they
        nor anything else from it counts as load (those requests are long over).
        """
        try:
            msg = decode(payload)
        except msgspec.DecodeError:
            self.metrics.errors.labels("decode").inc()
            return False
        if msg.instance == self.instance_id:
            return False  # our own: in the index and the load view already
        heard = live and self._hear(msg)
        if isinstance(msg, Progress):
            if live and msg.request_id:
                self._progress(f"{msg.instance}/{msg.request_id}", msg.done)
            elif heard and msg.seq > 0:  # a heartbeat that counts its own, and says how it
                self._hashes_as(msg.instance, msg.keys)  # hashes prompts
                if msg.open >= 0:
                    self._reconcile(msg.instance, msg.open)
            return False  # not a decision
        if isinstance(msg, Withdrawn):
            if live:
                self._withdrawn(f"{msg.instance}/{msg.request_id}")
            return False
        if isinstance(msg, Stored):  # live or replayed: the replica still holds it
            if self.on_stored is not None:
                self.on_stored(msg.tenant, msg.response_id, ReplicaId(msg.replica))
            return False
        try:  # only now: every instance also hears its own decisions, whose hashes it has
            hashes = msg.block_hashes()
        except ValueError:
            self.metrics.errors.labels("decode").inc()
            return False
        if msg.instance in self._other_keys:
            self.metrics.skipped.labels("other_hashing").inc()
            return False  # hashes that never match ours: nothing in them for our index
        replica = ReplicaId(msg.replica)
        with self.lock:
            if not self.router.has_replica(replica):
                self._unknown(msg.instance, replica)
                return False  # a replica we don't route to
            now = time.monotonic()
            counted = live and msg.request_id and self.share_load
            # Counted, its added blocks are kept by its key until it ends: a withdrawal can
            # take them back (uncounted, no end would ever forget them).
            key = f"{msg.instance}/{msg.request_id}" if counted else None
            if key is not None and self._replayed(msg, key):
                # Its index entry is still news (a decision is one, replayed or not); its load
                # is not. Dropped whole, a clock 60 s off lost every shared prefix unsaid.
                self.metrics.skipped.labels("replayed").inc()
                self._clock_off(msg)
                key = None
            self.router.remote_routed(replica, hashes, now, live=live, request_id=key)
            if key is not None:
                self._count(msg, key, replica, now)
        if live:
            self.metrics.applied.inc()
        return True

    def _unknown(self, instance: str, replica: ReplicaId) -> None:
        """Count a decision for a replica we do not route to, and say so once per replica
        (a few): sharing between instances that name one replica two ways (``localhost``
        and ``127.0.0.1``) was off without a word (an outside audit, 2026-12-06)."""
        self.metrics.skipped.labels("unknown_replica").inc()
        if _first_of(self._unknown_said, replica):
            log.warning(
                "sync: instance %s routes to %s, which this instance does not know: its "
                "decisions there are not applied (name replicas alike at every instance)",
                instance[:64], replica[:256],
            )  # fmt: skip

    def _hear(self, msg: Message) -> bool:
        """Note that ``msg.instance`` is alive; False where that is not to be believed. With
        signed messages, an instance that numbers its heartbeats is heard from those alone,
        each numbered past the last and sent within ``FRESH_S``: a recorded heartbeat sent
        again kept a killed instance's requests counted as long as it was repeated (an outside
        audit, 2026-12-07). An instance that predates the numbers, from any live message."""
        instance, last = msg.instance, self._seq.get(msg.instance, 0)
        beat = msg if isinstance(msg, Progress) and not msg.request_id and msg.seq else None
        seq = beat.seq if beat is not None else 0
        if beat is not None and (
            seq <= last or self.fresh_only and abs(_wall_clock() - beat.sent_at) > FRESH_S
        ):
            return False
        if self.fresh_only and last and not seq:
            return False  # a decision or an end, perhaps sent again: not proof of life
        if len(self._heard) >= INSTANCES and instance not in self._heard:
            self._heard.clear()  # bounded; the live ones are heard again within seconds
            self._seq.clear()
        self._heard[instance] = time.monotonic()
        if seq:
            self._seq[instance] = seq
        return True

    def _reconcile(self, instance: str, open_requests: int) -> None:
        """``instance`` says ``open_requests`` of its counted requests have not ended: drop
        those we count beyond that, sent longest ago first. Its messages come in order, so we
        hold no more than it said unless their ends were lost (a full queue), or their
        decisions sent again after their ends (replayed to an instance that never heard the
        ends: they counted for ``REMOTE_TTL_S``, an outside audit, 2026-12-07)."""
        prefix = instance + "/"
        held = [key for key in self._remote if key.startswith(prefix)]
        if len(held) <= open_requests:
            return
        held.sort(key=lambda key: self._sent_at.get(key, 0.0))  # else stays oldest first
        self._drop(held[: len(held) - open_requests], time.monotonic(), ended=True)

    def _hashes_as(self, instance: str, keys: str) -> None:
        """``instance`` hashes prompts as ``keys`` says ("": an instance that predates it):
        unlike us, its decisions are skipped, and said once per instance (a few). Instances
        given different block sizes (``--block-chars``) shared nothing, unsaid, while each
        counted the other as heard (an outside audit, 2026-12-07)."""
        if not keys or keys == self.keys:
            self._other_keys.pop(instance, None)
            return
        if instance not in self._other_keys and len(self._other_keys) < INSTANCES:
            self._other_keys[instance] = keys
            if len(self._other_keys) <= UNKNOWN_SAID:
                log.warning(
                    "sync: instance %s hashes prompts otherwise (block size and hash %s, here "
                    "%s): its decisions are skipped; give every instance the same block size "
                    "(--block-chars, or --kv-block-size with --tokenizer) and hash seed",
                    instance[:64], keys[:64], self.keys,
                )  # fmt: skip

    def _clock_off(self, msg: Routed) -> None:
        """Say once per instance (a few) that its decisions were sent more than ``FRESH_S``
        from our clock: clocks apart, or decisions sent again."""
        off = _wall_clock() - msg.sent_at
        if abs(off) > FRESH_S and _first_of(self._clock_said, msg.instance):
            log.warning(
                "sync: instance %s sent decisions %.0f s from this instance's clock: they are "
                "shared, but count no load here (keep the instances' clocks within %g s: NTP)",
                msg.instance[:64], off, FRESH_S,
            )  # fmt: skip

    def _replayed(self, msg: Routed, key: str) -> bool:
        """Whether a live decision is one sent before, again: with signed messages, one sent
        more than ``FRESH_S`` from now (by its clock) or for a request whose end we heard.
        Recorded signed messages sit in the history, and 2,000 of them, sent again, would count
        2,000 requests for ten minutes each: every instance's requests 503."""
        if not self.fresh_only:
            return False
        if abs(_wall_clock() - msg.sent_at) > FRESH_S:
            return True
        ended = self._ended.get(key)
        return ended is not None and msg.sent_at <= ended[1]

    def _count(self, msg: Routed, key: str, replica: ReplicaId, now: float) -> None:
        self.router.remote_dispatch(
            key,
            replica,
            prompt_tokens=msg.prompt_tokens,
            output_tokens=msg.output_tokens,
            predicted_cached_tokens=msg.predicted_cached_tokens,
            now=now,
        )
        self._remote.pop(key, None)  # a retry re-dispatches: it moves to the young end
        self._remote[key] = now
        if self.fresh_only:
            self._sent_at[key] = msg.sent_at

    def _withdrawn(self, key: str) -> None:
        """Its replica turned it away: the blocks its decision added leave our index too. Its
        end, or its next decision, follows."""
        if key in self._remote:  # else routed before we subscribed, or expired: not kept
            with self.lock:
                self.router.withdraw(key)

    def _progress(self, key: str, done: bool) -> None:
        if key not in self._remote:
            return  # routed before we subscribed, or already expired
        now = time.monotonic()
        with self.lock:
            if done:
                self._end(key, now, heard=True)
            else:
                # Heard through Redis, late by the message's trip: not a measured first token.
                self.router.first_token(key, now, measured=False)

    def expire_due(self, now: float) -> None:
        """Expire (:meth:`expire`) at most once every ``EXPIRE_EVERY_S``."""
        if now - self._expired_at >= EXPIRE_EVERY_S:
            self.expire(now)

    def expire(self, now: float) -> None:
        """Drop remote requests dispatched more than ``REMOTE_TTL_S`` ago (end never heard)."""
        self._expired_at = now
        ended = self._ended
        while ended:  # oldest first: an end past FRESH_S cannot be replayed any more
            key, (at, _) = next(iter(ended.items()))
            if now - at <= FRESH_S:
                break
            del ended[key]
        cutoff = now - REMOTE_TTL_S
        stale = []
        for key, at in self._remote.items():
            if at > cutoff:
                break  # oldest first: the rest are younger
            stale.append(key)
        gone = {i for i, at in self._heard.items() if now - at > SILENT_S}
        if gone:  # their requests, however young: nobody will send their ends
            stale += [k for k in self._remote if k.partition("/")[0] in gone and k not in stale]
            for instance in gone:
                del self._heard[instance]
                self._seq.pop(instance, None)
        self._drop(stale, now)

    def _drop(self, keys: list[str], now: float, ended: bool = False) -> None:
        """Drop these remote requests from the load view, their ends never heard (``ended``:
        taken as heard, so that their decisions sent again count no more)."""
        with self.lock:
            for key in keys:
                self._end(key, now, heard=ended)
        self.metrics.expired.inc(len(keys))

    def _end(self, key: str, now: float, heard: bool) -> None:
        """``key`` leaves the load view (the lock held); ``heard``: its end is taken as heard,
        so that its decision sent again (signed) counts no more."""
        del self._remote[key]
        sent_at = self._sent_at.pop(key, math.inf)
        self.router.complete(key, now)
        if heard and self.fresh_only:
            self._ended.pop(key, None)  # (to the young end)
            self._ended[key] = (now, sent_at)

    def forget(self) -> None:
        """Drop every remote request from the load view (their ends can no longer be heard)."""
        now = time.monotonic()
        with self.lock:
            for key in self._remote:
                self.router.complete(key, now)
        self._remote.clear()
        self._sent_at.clear()
