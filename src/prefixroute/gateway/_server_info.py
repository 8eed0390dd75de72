"""What an engine says of its own batch size: how many requests it runs at once.

Once every batch slot of a replica is taken, a request sent there waits for running ones to
finish (core/batch_slots.py). The router learns the slot count from the engine's running and
waiting counts only after the batch has filled and stayed full, so the first requests that
wait for a slot are sent before it knows; an engine that states its size spares them. Two do:

* **SGLang**, ``GET /get_server_info``: its server arguments and scheduler state in one object.
  ``internal_states`` holds one entry per data-parallel rank, each with
  ``effective_max_running_requests_per_dp`` (the limit the scheduler derived, whether or not
  ``--max-running-requests`` was given): their sum is the replica's. An engine too old to carry
  it gives the ``max_running_requests`` argument, where set.
* **vLLM**, only with ``VLLM_SERVER_DEV_MODE=1`` (its development endpoints; the CI's engines run
  so), ``GET /server_info?config_format=json``: ``vllm_config.scheduler_config.max_num_seqs``
  per engine, times ``parallel_config.data_parallel_size``. vLLM says it nowhere else: its
  metrics' info gauge carries the cache's configuration, not the scheduler's.

:class:`ServerInfo` asks each replica in the background of the health rounds, not in them: vLLM
builds an environment report on its first ``/server_info`` (1.4 s on an idle CPU engine,
longer beside another starting), past a probe's timeout, and a round must not wait for it. A
replica is asked until it says a size or has nothing to say: a path that answered 404, or 200
with no size in it, is not asked again at that replica; no answer or another status is tried
again next round, ``TRIES`` times. A replica whose models are learned again (it came back, and
may have restarted with other arguments) is asked again. A size is the router's at once
(``Router.observe_replica``); nothing said leaves the router learning it from the engine's
counts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from prefixroute._tasks import cancel_and_wait
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry

# Where each engine says it, in the order asked (a replica that answers one is not asked the
# next).
SGLANG_PATH = "/get_server_info"
VLLM_DEV_PATH = "/server_info?config_format=json"
PATHS = (SGLANG_PATH, VLLM_DEV_PATH)
ASK_TIMEOUT_S = 30.0  # seconds: vLLM's first /server_info builds a report (module docstring)
TRIES = 3  # asks that got no answer (or an error status) before a replica is left alone

log = logging.getLogger(__name__)


def _whole(value: object) -> int | None:
    """``value`` if it is a positive whole number (not a bool), else None."""
    return value if type(value) is int and value > 0 else None


def batch_size_said(body: object) -> int | None:
    """The batch size an engine's server-information ``body`` gives, requests (module
    docstring); None when it gives none."""
    if not isinstance(body, Mapping):
        return None
    states = body.get("internal_states")
    if isinstance(states, list) and states:
        per_rank = [
            _whole(s.get("effective_max_running_requests_per_dp"))
            for s in states if isinstance(s, Mapping)
        ]  # fmt: skip
        if per_rank and all(n is not None for n in per_rank):
            return sum(n for n in per_rank if n is not None)
    said = _whole(body.get("max_running_requests"))
    if said is not None:
        return said
    return _vllm_batch_size(body.get("vllm_config"))


def _vllm_batch_size(config: object) -> int | None:
    """``max_num_seqs`` times the data-parallel engines, from vLLM's config as JSON."""
    if not isinstance(config, Mapping):
        return None  # the text form (the endpoint's default) is not parsed
    scheduler, parallel = config.get("scheduler_config"), config.get("parallel_config")
    seqs = _whole(scheduler.get("max_num_seqs")) if isinstance(scheduler, Mapping) else None
    if seqs is None:
        return None
    engines = _whole(parallel.get("data_parallel_size")) if isinstance(parallel, Mapping) else None
    return seqs * (engines or 1)


class ServerInfo:
    """Asks replicas for their batch size and tells the router (module docstring)."""

    def __init__(self, registry: ReplicaRegistry, session: aiohttp.ClientSession) -> None:
        self.registry = registry
        self.session = session
        self._timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        self._missing: set[tuple[str, str]] = set()  # (replica URL, path): nothing to say there
        self._settled: set[str] = set()  # replica URLs asked to the end since they joined
        self._failed: dict[str, int] = {}  # replica URL -> asks that got no answer
        self._asking: dict[str, asyncio.Task[int | None]] = {}  # replica URL -> its ask

    def joined(self, record: ReplicaRecord) -> None:
        """``record``'s models were learned (again): ask it again."""
        self._settled.discard(record.url)
        self._failed.pop(record.url, None)

    def ask(self, record: ReplicaRecord) -> None:
        """Start asking ``record`` in the background, unless it was asked to the end since it
        joined or is being asked."""
        url = record.url
        if url not in self._settled and url not in self._asking:
            self._asking[url] = asyncio.get_running_loop().create_task(
                self._ask(record), name=f"server info {url}"
            )

    async def _ask(self, record: ReplicaRecord) -> int | None:
        try:
            return await self.learn(record)
        except Exception:  # a bug here must not end up as an unretrieved task error
            log.exception("asking %s its batch size failed", record.url)
            self._settled.add(record.url)
            return None
        finally:
            self._asking.pop(record.url, None)

    async def stop(self) -> None:
        for task in list(self._asking.values()):
            await cancel_and_wait(task)

    async def learn(self, record: ReplicaRecord) -> int | None:
        """Ask ``record``'s engine its batch size now; the router is told what it says.
        Returns the size, or None where it said none (yet)."""
        url, unanswered = record.url, False
        for path in PATHS:
            if (url, path) in self._missing:
                continue
            status, body = await self._get(url + path)
            size = batch_size_said(body) if status == 200 else None
            if size is None:
                if status in (200, 404):
                    self._missing.add((url, path))  # nothing to say there
                else:
                    unanswered = True  # no answer, or an error: try again next round
                continue
            router = self.registry.router
            if router.has_replica(record.id):
                router.observe_replica(record.id, max_running=size)
            self._settled.add(url)
            return size
        failed = self._failed[url] = self._failed.get(url, 0) + unanswered
        if not unanswered or failed >= TRIES:
            self._settled.add(url)
        return None

    async def _get(self, url: str) -> tuple[int | None, Any]:
        """(status, parsed JSON body or None); (None, None) when nothing answered in time."""
        try:
            async with self.session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    return resp.status, None
                try:
                    return 200, json.loads(await resp.read())
                except (ValueError, RecursionError):
                    return 200, None  # an answer that is not JSON says nothing
        except (aiohttp.ClientError, TimeoutError):
            return None, None
