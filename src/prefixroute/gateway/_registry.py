"""The replica registry: which replicas exist, what they serve, and whether they may get traffic.

State machine of one replica (``failure_threshold`` = F, ``eject_s`` = E)::

    healthy --F consecutive failures (requests or probes)--> unhealthy (out for at least E s)
    healthy --success rate an outlier among its peers--> unhealthy (out for at least E s)
    unhealthy --a successful /health probe after E s--> healthy
    any --admin drain--> draining (no new requests; in-flight ones finish)

Which request failures count is the proxy's call (``_proxy``: a failure the same request
repeats on another replica is the request's, not the replica's). Beside that, every answer is
an outcome in a sliding window per replica, and a replica whose error rate stands
``OUTLIER_MARGIN`` above its peers' pooled rate, over at least ``OUTLIER_MIN_REQUESTS`` answers,
is taken out too: the way Envoy's outlier detection catches a replica that fails requests its
peers serve, without trusting any single answer. Requests waiting on a replica when it is taken
out are told at once (:meth:`ReplicaRegistry.on_ejected`), so none waits on a dead replica.

A request that succeeds resets the failure count; a probe that succeeds does not, so a replica
whose ``/health`` answers while its completions fail still gets taken out. A new replica (at
start or through the admin API) is probed at once: if it answers it takes traffic from the next
request, without waiting for a probe period (policies see it cold, with an empty index, and fall
back to load); if not, it starts unhealthy and comes in with its first successful probe.

Pure bookkeeping, no I/O: probes live in ``_health``. The registry is the only place that makes
:class:`ReplicaId` values (normalised base URLs), and it keeps the router's replica set in step.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import unquote

from prefixroute.core import ConfigError, NoReplicaAvailable, ReplicaId, Router, SpeedPrior
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._context_window import card_window
from prefixroute.gateway._errors import Conflict, ModelNotFound, NotFound, Overloaded
from prefixroute.gateway._replica_url import normalize_url as normalize_url  # re-exported

log = logging.getLogger(__name__)

OUTLIER_WINDOW_S = 30.0  # outcomes this recent count towards a replica's error rate, seconds
OUTLIER_MIN_REQUESTS = 20  # answers in the window before a replica can be judged, requests
OUTLIER_MARGIN = 0.5  # error rate above the peers' pooled rate that takes a replica out
_WINDOW_CAP = 512  # outcomes kept per replica (memory bound at high rates)


class ReplicaStatus(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"


@dataclass(slots=True)
class ReplicaRecord:
    id: ReplicaId  # normalised base URL, e.g. "http://10.0.0.11:8000"
    models: frozenset[str] | None = None  # model ids from /v1/models; None until known
    model_cards: tuple[Mapping[str, Any], ...] = ()  # the /v1/models entries as sent
    adapters: frozenset[str] = frozenset()  # of ``models``, the LoRA adapters (cards with a parent)
    context_window: int | None = None  # its card's max_model_len or its 400's (_context_window)
    healthy: bool = True  # may get traffic (unless draining)
    draining: bool = False  # drained by the admin: no new requests
    failures: int = 0  # consecutive failures (requests and probes)
    out_until: float = 0.0  # monotonic time before which it stays out, seconds
    total_failures: int = 0  # failures since registration
    ejections: int = 0  # times taken out since registration (a scrape can miss a short one)
    cache_losses: int = 0  # times its whole cache was taken as lost (gateway._health)
    name: str = ""  # what clients see when URLs are not exposed: r-<8 hex digits of its URL>
    # monotonic time of its last first token or answer, any request's: it is at work
    # (gateway._first_byte), seconds
    progress_at: float = 0.0
    # (monotonic time, ok) of recent answers, for the outlier check; newest last
    outcomes: deque[tuple[float, bool]] = field(default_factory=lambda: deque(maxlen=_WINDOW_CAP))

    @property
    def url(self) -> str:
        return str(self.id)

    @property
    def status(self) -> ReplicaStatus:
        if self.draining:
            return ReplicaStatus.DRAINING
        return ReplicaStatus.HEALTHY if self.healthy else ReplicaStatus.UNHEALTHY

    def serves(self, model: str) -> bool:
        return self.models is None or model in self.models


def replica_name(rid: ReplicaId) -> str:
    """A stable, opaque name for ``rid``: the same on every gateway instance and restart,
    without the internal address."""
    return "r-" + hashlib.sha256(rid.encode()).hexdigest()[:8]


_T = TypeVar("_T")


def by_replica(
    by_url: Mapping[str, _T],
    known: Iterable[str],
    what: str,
    id_of: Callable[[str], ReplicaId] = normalize_url,
    known_as: str = "a configured replica",
) -> dict[ReplicaId, _T]:
    """Per-replica settings by replica id (addresses written any way ``id_of`` takes them:
    ``--replica`` URLs for serve, the picker's ``--endpoint`` addresses); raises ConfigError
    for a replica not among the ``known`` ones."""
    ids = {id_of(url) for url in known}
    out: dict[ReplicaId, _T] = {}
    for url, value in by_url.items():
        rid = id_of(url)
        if rid not in ids:
            raise ConfigError(f"{what} given for {url}, which is not {known_as}")
        out[rid] = value
    return out


class ReplicaRegistry:
    """Replicas by id, kept in step with the router's replica set."""

    def __init__(self, router: Router, config: GatewayConfig) -> None:
        self.router = router
        self.config = config
        self._records: dict[ReplicaId, ReplicaRecord] = {}
        # Callbacks of requests waiting on a replica's first byte, fired when it is taken out.
        self._waiting: dict[ReplicaId, set[Callable[[], None]]] = {}
        self._adapters: frozenset[str] = frozenset()  # adapter names any replica lists
        self._on_added: list[Callable[[ReplicaId], None]] = []  # hooks for each new replica
        self._on_removed: list[Callable[[ReplicaId], None]] = []  # and each one removed
        # Speed priors given by replica, for one that joins without its own (the picker's
        # endpoints from a file or pods: named in the config before they appear).
        self.priors: dict[ReplicaId, SpeedPrior] = {}

    # --- membership -----------------------------------------------------------------------
    def add(self, url: str, speed: SpeedPrior | None = None) -> ReplicaRecord:
        """Register the replica at ``url`` (``speed``: its own speed priors, if known; else
        those given for it in ``priors``)."""
        rid = normalize_url(url)
        if rid in self._records:
            raise Conflict(f"replica {rid} is already registered")
        record = self._records[rid] = ReplicaRecord(rid, name=replica_name(rid))
        self.router.add_replica(rid, speed=speed if speed is not None else self.priors.get(rid))
        log.info("replica %s added", rid)
        for callback in self._on_added:
            callback(rid)
        return record

    def on_added(self, callback: Callable[[ReplicaId], None]) -> None:
        """Call ``callback`` with each replica registered from now on, however it came
        (configuration, the admin API, discovery)."""
        self._on_added.append(callback)

    def on_removed(self, callback: Callable[[ReplicaId], None]) -> None:
        """Call ``callback`` with each replica removed from now on, after the router forgot it."""
        self._on_removed.append(callback)

    def remove(self, rid: ReplicaId) -> ReplicaRecord:
        """Forget ``rid`` (no new requests; the ones in flight finish and are accounted)."""
        record = self.get(rid)
        in_flight = self.in_flight(rid)
        del self._records[rid]
        self._adapters = frozenset().union(*(r.adapters for r in self._records.values()))
        self.router.remove_replica(rid)
        log.info("replica %s removed (%d requests still in flight)", rid, in_flight)
        for callback in self._on_removed:
            callback(rid)
        return record

    def drain(self, rid: ReplicaId) -> ReplicaRecord:
        record = self.get(rid)
        if not record.draining:
            record.draining = True
            log.info("replica %s draining (%d in flight)", rid, self.in_flight(rid))
        return record

    def get(self, rid: ReplicaId) -> ReplicaRecord:
        try:
            return self._records[rid]
        except KeyError:
            raise NotFound(f"no replica {rid}") from None

    def find(self, ref: str) -> ReplicaRecord:
        """A record by its id as written in an admin path (URL-quoted or not), or by its name
        (``r-...``: what clients and the admin listing show, where operators copy it from)."""
        named = next((r for r in self._records.values() if r.name == ref), None)
        if named is not None:
            return named
        try:
            rid = normalize_url(unquote(ref))
        except ConfigError as exc:
            raise NotFound(f"no replica {ref!r}") from exc
        return self.get(rid)

    def __iter__(self) -> Iterator[ReplicaRecord]:
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def public_name(self, rid: ReplicaId) -> str:
        """How clients see ``rid`` (headers, error messages): its URL only when configured."""
        if self.config.expose_replica_urls:
            return str(rid)
        record = self._records.get(rid)
        return record.name if record is not None else replica_name(rid)

    def in_flight(self, rid: ReplicaId) -> int:
        """Requests in flight on ``rid``, from the router's own load accounting."""
        return self.router.replica_load(rid).in_flight if rid in self._records else 0

    # --- routing --------------------------------------------------------------------------
    def candidates(self, model: str | None, exclude: Sequence[ReplicaId] = ()) -> list[ReplicaId]:
        """Replicas that may take a request for ``model`` now.

        Raises ModelNotFound (no replica serves the model at all), NoReplicaAvailable (none
        healthy) or Overloaded (every healthy one at its in-flight cap).
        """
        return self.with_room(self.ready(model, exclude))

    def ready(self, model: str | None, exclude: Sequence[ReplicaId] = ()) -> list[ReplicaId]:
        """:meth:`candidates` before the in-flight cap: healthy, not draining, serving
        ``model``. Raises ModelNotFound or NoReplicaAvailable."""
        records = list(self._records.values())
        if model:  # None or "": no model named, so any replica (vLLM serves its default)
            records = [r for r in records if r.serves(model)]
            if not records and self._records:
                # The name is the client's bytes: not repeated (docs/security.md).
                raise ModelNotFound(
                    "the requested model is not served by any replica (GET /v1/models lists them)"
                )
        ready = [r.id for r in records if r.healthy and not r.draining and r.id not in exclude]
        if not ready:
            raise NoReplicaAvailable("no healthy replica available for this request")
        return ready

    def with_room(self, ready: Sequence[ReplicaId]) -> list[ReplicaId]:
        """``ready`` below the in-flight cap; raises Overloaded when that is none of them."""
        cap = self.config.max_in_flight_per_replica
        load = self.router.replica_load
        free = [rid for rid in ready if load(rid).in_flight < cap]
        if not free:
            raise Overloaded("every replica is at its in-flight limit; retry later")
        return free

    def adapter_of(self, model: str | None) -> str | None:
        """``model`` when a replica serves it as a LoRA adapter, else None (a base model, or
        no model named): the key space its prefixes are cached in (``Router.view``)."""
        return model if model is not None and model in self._adapters else None

    def model_cards(self) -> list[Mapping[str, Any]]:
        """The union of the replicas' ``/v1/models`` entries, first seen wins per id."""
        seen: dict[str, Mapping[str, Any]] = {}
        for record in self._records.values():
            for card in record.model_cards:
                seen.setdefault(str(card.get("id")), card)
        return list(seen.values())

    # --- health ---------------------------------------------------------------------------
    def record_success(self, rid: ReplicaId, now: float | None = None) -> None:
        """A request the replica served; ``now`` also records it as an outcome."""
        record = self._records.get(rid)
        if record is not None:
            record.failures = 0
            if now is not None:
                record.outcomes.append((now, True))

    def progressed(self, rid: ReplicaId, now: float) -> None:
        """``rid`` sent a first token or a whole answer at ``now`` (monotonic): it is at work
        (an error answer is not: a stopped engine's HTTP server may still refuse requests)."""
        record = self._records.get(rid)
        if record is not None:
            record.progress_at = max(record.progress_at, now)

    def progress_at(self, rid: ReplicaId) -> float:
        """When ``rid`` last sent a first token or an answer (monotonic; 0.0: never)."""
        record = self._records.get(rid)
        return 0.0 if record is None else record.progress_at

    def record_failure(self, rid: ReplicaId, now: float, why: str) -> None:
        """A failure that is the replica's: counts towards ``failure_threshold``."""
        record = self._records.get(rid)
        if record is None:
            return
        record.failures += 1
        record.total_failures += 1
        record.outcomes.append((now, False))
        if record.healthy and record.failures >= self.config.failure_threshold:
            self._eject(record, now, f"after {record.failures} failures ({why})")

    def record_error(self, rid: ReplicaId, now: float) -> None:
        """An error answer that may be the request's (a 5xx no peer was asked to repeat): it
        only counts in the error rate, and takes the replica out only as an outlier."""
        record = self._records.get(rid)
        if record is None:
            return
        record.outcomes.append((now, False))
        if not record.healthy:
            return
        rate, n = _error_rate([record], now)
        peers = [r for r in self._records.values() if r is not record]
        peer_rate, peer_n = _error_rate(peers, now)
        if n >= OUTLIER_MIN_REQUESTS and peer_n and rate - peer_rate >= OUTLIER_MARGIN:
            self._eject(record, now, f"error rate {rate:.0%} against its peers' {peer_rate:.0%}")

    def _eject(self, record: ReplicaRecord, now: float, why: str) -> None:
        record.healthy = False
        record.out_until = now + self.config.eject_s
        record.ejections += 1
        log.warning("replica %s taken out %s", record.id, why)
        for callback in list(self._waiting.pop(record.id, ())):
            callback()

    def on_ejected(self, rid: ReplicaId, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (once) if ``rid`` is taken out; returns the function that cancels
        the watch. The proxy uses it to stop waiting on a replica declared dead."""
        waiting = self._waiting.setdefault(rid, set())
        waiting.add(callback)

        def cancel() -> None:
            waiting.discard(callback)

        return cancel

    def record_probe(self, rid: ReplicaId, ok: bool, now: float, first: bool = False) -> None:
        """A probe's result. A replica that fails its very first probe starts out of rotation
        (it comes in with the first probe that succeeds), instead of failing requests first."""
        record = self._records.get(rid)
        if record is None:
            return
        if not ok and first:
            record.failures += 1
            record.total_failures += 1
            self._eject(record, now, "at registration: its first health probe failed")
            record.out_until = now
        elif not ok:
            self.record_failure(rid, now, "health probe failed")
        elif not record.healthy and now >= record.out_until:
            record.healthy = True
            record.failures = 0
            log.info("replica %s is healthy again", rid)

    def set_models(self, rid: ReplicaId, cards: Sequence[Mapping[str, Any]]) -> None:
        record = self._records.get(rid)
        if record is not None:
            record.model_cards = tuple(cards)
            record.models = frozenset(str(c.get("id")) for c in cards)
            record.adapters = frozenset(str(c.get("id")) for c in cards if _is_adapter(c))
            record.context_window = card_window(cards) or record.context_window
            self._adapters = frozenset().union(*(r.adapters for r in self._records.values()))

    def describe(self, record: ReplicaRecord) -> dict[str, Any]:
        """The admin API's view of one replica."""
        return {
            "id": record.url,
            "url": record.url,
            "status": record.status.value,
            "models": sorted(record.models) if record.models is not None else None,
            "in_flight": self.in_flight(record.id),
            "name": record.name,
            "speed": self.router.replica_load(record.id).speed_report(),
            "context_window": record.context_window,  # tokens; None: not known
            "consecutive_failures": record.failures,
            "total_failures": record.total_failures,
            "ejections": record.ejections,
            "cache_losses": record.cache_losses,
        }


def _is_adapter(card: Mapping[str, Any]) -> bool:
    """A LoRA adapter's card: vLLM lists each adapter with ``parent``, its base model's id;
    a base model's card has ``parent: null``."""
    parent = card.get("parent")
    return isinstance(parent, str) and bool(parent) and parent != card.get("id")


def _error_rate(records: Sequence[ReplicaRecord], now: float) -> tuple[float, int]:
    """Pooled error rate of ``records`` over the outlier window, and how many answers."""
    since = now - OUTLIER_WINDOW_S
    errors = total = 0
    for record in records:
        outcomes = record.outcomes
        while outcomes and outcomes[0][0] < since:
            outcomes.popleft()
        total += len(outcomes)
        errors += sum(1 for _, ok in outcomes if not ok)
    return (errors / total if total else 0.0), total
