"""Active health checks: probe every replica's ``/health`` each interval, learn its models.

A probe is one GET of ``health_path`` (``/health``) within ``health_timeout_s`` (5 s: SGLang's
``/health`` generates a token and answers a second later, so at 1 s every SGLang replica was
out); each replica's checks run apart, so one that holds its probes to the timeout holds no
other's round (``_round``). Any answer but 200 is a failure, except that a replica that
answers that path 404 has no such endpoint (an OpenAI-compatible server written without
one): it is probed on ``/v1/models`` from then on, and the change is logged once. Without this,
such a fleet was never healthy and every request was refused. A replica whose models are not
known yet, or that is coming back, also gets ``GET /v1/models``, so requests that
name a model reach only replicas that serve it; so does every replica once ``models_refresh_s``
(10 s) has passed since its last list, because engines change their models while they run:
vLLM and SGLang load and unload LoRA adapters at runtime (``/v1/load_lora_adapter``), each
served under its own model name. Without it, an adapter loaded after a replica joined was a 404
for as long as the replica stayed healthy. Results go to the registry, which decides.
A healthy replica's ``/metrics`` is scraped in the same round for the engine's own load
(``_scrape``); a replica without one (404) is not asked again. Where the engine exports its
prefill times, each round's increase teaches the router that replica's prefill rate
(``Router.observe_engine_prefill``), and its preemptions what not to learn from
(``Router.observe_preemptions``); where it says its KV cache's size, the replica's index is
sized to it (``_index_size``). Where scraping is on, each replica is also asked its batch size
(SGLang and vLLM's development mode state it: ``_server_info``), once after its models are
learned, in the background of the rounds.

A replica whose last scrape showed requests waiting while its batch size is not known yet is
scraped again every ``FULL_WATCH_S`` (0.25 s), not just each round, until its size is learned or
nothing waits. Learning a size takes ``FULL_REPORTS`` (8) reports of a full batch
(core/batch_slots.py): 16 s of 2 s rounds, while the router, blind to the wait for a slot,
filled that replica's queue. On llm-d-inference-sim at 16 slots and 500 conversations (every
pool full) the default policy's p99 TTFT was 21.0 s against least_loaded's 15.3 s; told the
batch size, 16.1 s; with rounds of 0.25 s, 16.3 s (docs/results.md).

A replica whose engine lost its KV cache leaves the prefix index stale: requests sent there for
prefixes it no longer holds, predicted as cheap. In approximate mode (precise mode's KV events
say so themselves) two signs clear what the index holds for it: a probe whose connection is
refused (nothing listens: the process is gone, and its cache), and a scrape whose prefill
counters went down or vanished (the engine began again, perhaps between two probes: a fresh
SGLang exports none until its first request). A replica that
refuses probe after probe is cleared, and logged, once.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import aiohttp

from prefixroute._tasks import cancel_and_wait, every
from prefixroute.core import PreemptionCounts
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._index_size import IndexSizer
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry
from prefixroute.gateway._scrape import PrefillDeltas, parse_engine_load
from prefixroute.gateway._server_info import ServerInfo

log = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"  # every OpenAI-compatible server has it: the fallback probe
FULL_WATCH_S = 0.25  # seconds between scrapes of a full batch of unknown size (docstring)


class HealthChecker:
    models_refresh_s = 10.0  # seconds between a healthy replica's model lists (docstring)

    def __init__(
        self, registry: ReplicaRegistry, session: aiohttp.ClientSession, config: GatewayConfig
    ) -> None:
        self.registry = registry
        self.session = session
        self.config = config
        self._timeout = aiohttp.ClientTimeout(total=config.health_timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None  # full batches of unknown size
        self._scraping: set[str] = set()  # replicas whose /metrics is being read now
        self._no_metrics: set[str] = set()  # replicas whose /metrics answered 404
        self._no_health: set[str] = set()  # replicas whose health path answered 404
        self._prefill = PrefillDeltas()  # each replica's last prefill totals
        self._preempted = PreemptionCounts()  # and preemption counts
        self._down: set[str] = set()  # refused connections: cleared, not answering yet
        self._odd: set[str] = set()  # replicas whose models or metrics failed to apply (logged)
        self._listed: dict[str, float] = {}  # replica URL -> when its models were last asked
        self._sizer = IndexSizer(registry, config)  # indexes sized from the engines' KV caches
        self.server_info = ServerInfo(registry, session)  # the engines' batch sizes
        self._checking: dict[str, asyncio.Task[bool]] = {}  # replica URL -> its check under way

    def start(self) -> None:
        if self._task is None:
            self._task = every(self.config.health_interval_s, self._round, self._failed, "health")
        if self._watch is None and self.config.scrape_metrics:
            self._watch = every(FULL_WATCH_S, self.watch_full, self._failed, "batch watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        watch, self._watch = self._watch, None
        await cancel_and_wait(watch)
        for check in list(self._checking.values()):
            await cancel_and_wait(check)
        await self.server_info.stop()

    @staticmethod
    def _failed(exc: Exception) -> None:
        log.exception("health check round failed")  # a bug here must not end health checking

    async def check_all(self, first: bool = False) -> None:
        """Probe every replica, and return when every probe has ended."""
        await asyncio.gather(*(self.check(record, first) for record in self.registry))

    async def _round(self) -> None:
        """One round of the loop: a check of each replica whose last one has ended, waited
        for at most an interval. SGLang's ``/health`` answers after a second at best (it
        generates a token, then looks a second later), so the probe's timeout is 5 s; one
        replica that holds its probes that long must not hold every other replica's checks,
        and the scrapes in them, for as long (a round waited for its slowest probe)."""
        started = []
        for record in self.registry:
            if record.url not in self._checking:
                task = asyncio.get_running_loop().create_task(self.check(record))
                self._checking[record.url] = task
                task.add_done_callback(functools.partial(self._checked, record.url))
                started.append(task)
        if started:
            await asyncio.wait(started, timeout=self.config.health_interval_s)

    def _checked(self, url: str, task: asyncio.Task[bool]) -> None:
        self._checking.pop(url, None)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:  # a bug here must not end health checking (the next round probes)
            log.error("health check of %s failed", url, exc_info=exc)

    async def check(self, record: ReplicaRecord, first: bool = False) -> bool:
        """Probe one replica (and learn its models when needed); returns whether it answered.

        ``first``: the replica was just registered (see ``ReplicaRegistry.record_probe``).
        """
        ok = await self._probe(record)
        try:
            if ok and (record.models is None or not record.healthy):
                await self.refresh_models(record)
                self.server_info.joined(record)  # it may have restarted with another batch size
            elif ok and self._models_stale(record):
                await self.refresh_models(record)  # adapters loaded or unloaded meanwhile
            if ok and self.config.scrape_metrics:
                self.server_info.ask(record)  # in the background: a first answer can take seconds
                if record.url not in self._no_metrics:
                    await self.scrape(record)
            self._odd.discard(record.url)
        except Exception:  # noqa: BLE001 - what a replica says must not stop its probe counting
            if record.url not in self._odd:  # once, not every round
                log.warning("replica %s: could not use what it reported", record.url,
                            exc_info=True)  # fmt: skip
            self._odd.add(record.url)
        self.registry.record_probe(record.id, ok, time.monotonic(), first)
        return ok

    async def watch_full(self) -> None:
        """Scrape again every healthy replica whose last scrape showed requests waiting
        while its batch size is unknown (module docstring)."""
        router = self.registry.router
        due = [
            record for record in self.registry
            if record.healthy and record.url not in self._no_metrics
            and router.has_replica(record.id)
            and (load := router.replica_load(record.id)).num_waiting
            and load.slots.size is None
        ]  # fmt: skip
        await asyncio.gather(*(self.scrape(record) for record in due))

    async def scrape(self, record: ReplicaRecord) -> None:
        """Read ``record``'s ``/metrics`` into the router, one scrape of a replica at a time:
        pages read in another order than fetched would show its counters going down (taken
        for a restart)."""
        if record.url in self._scraping:
            return
        self._scraping.add(record.url)
        try:
            await self._scrape(record)
        finally:
            self._scraping.discard(record.url)

    async def _scrape(self, record: ReplicaRecord) -> None:
        try:
            async with self.session.get(record.url + "/metrics", timeout=self._timeout) as resp:
                if resp.status == 404:
                    self._no_metrics.add(record.url)
                if resp.status != 200:
                    return
                text = (await resp.read()).decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError):
            return
        load = parse_engine_load(text)
        router = self.registry.router
        if not router.has_replica(record.id):
            self._prefill.forget(record.url)
            self._preempted.forget(record.url)
            return
        # A page that says nothing of the engine (not Prometheus text, a proxy's error page)
        # is no sign of a restart, and leaves the prefill baseline as it was.
        said = any(v is not None for v in (load.prefill, load.num_running, load.num_waiting))
        if said and self._prefill.restarted(record.url, load.prefill):
            self._cache_lost(record, "restarted (its prefill counters began again)")
        router.observe_replica(
            record.id,
            kv_usage=load.kv_usage,
            num_waiting=load.num_waiting,
            num_running=load.num_running,
        )
        if load.kv_tokens is not None:
            self._sizer.observe(record, load.kv_tokens)
        delta = self._prefill.update(record.url, load.prefill, load.in_flight) if said else None
        if delta is not None:
            router.observe_engine_prefill(
                record.id, tokens=delta.tokens, requests=delta.requests, seconds=delta.seconds
            )
        # After the interval's prefill times, which it may take back (core/preemptions.py).
        preempted = self._preempted.update(record.url, load.preemptions)
        if preempted is not None:
            router.observe_preemptions(record.id, preempted, time.monotonic())

    async def _probe(self, record: ReplicaRecord) -> bool:
        no_health = record.url in self._no_health
        path = MODELS_PATH if no_health else self.config.health_path
        try:
            async with self.session.get(record.url + path, timeout=self._timeout) as resp:
                await resp.read()
                status = resp.status
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError) and record.url not in self._down:
                self._down.add(record.url)
                self._cache_lost(record, "refused connections")
            return False
        except (aiohttp.ClientError, TimeoutError):
            return False
        self._down.discard(record.url)  # it answers again
        if status == 404 and not no_health and path != MODELS_PATH:
            self._no_health.add(record.url)
            log.warning("replica %s has no %s (404): probed on %s instead",
                        record.url, path, MODELS_PATH)  # fmt: skip
            return await self._probe(record)
        return status == 200

    def _cache_lost(self, record: ReplicaRecord, why: str) -> None:
        """``record``'s engine lost its KV cache (module docstring): the index forgets what it
        held. Precise mode leaves it to the engine's events."""
        router = self.registry.router
        if self.config.precise or not router.has_replica(record.id):
            return
        router.engine_cleared(record.id)
        record.cache_losses += 1
        log.warning("replica %s %s: the prefixes it cached are taken as lost", record.url, why)

    def _models_stale(self, record: ReplicaRecord) -> bool:
        return time.monotonic() >= self._listed.get(record.url, 0.0) + self.models_refresh_s

    async def refresh_models(self, record: ReplicaRecord) -> None:
        self._listed[record.url] = time.monotonic()
        try:
            async with self.session.get(record.url + MODELS_PATH, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return
                body = json.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        cards = _cards(body)
        if cards is not None:
            self.registry.set_models(record.id, cards)


def _cards(body: object) -> list[Mapping[str, Any]] | None:
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        return None
    return [c for c in body["data"] if isinstance(c, Mapping) and isinstance(c.get("id"), str)]
