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

:class:`ServerInfo` asks each replica when its models are (re)learned (it registered, or it came
back and may have restarted with other arguments), and a path that answered 404 is not asked
again at that replica. Anything else (no answer, a body without the field, a size that is not a
positive whole number) says nothing, and the router goes on learning the size from the engine's
counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry

# Where each engine says it, in the order asked (a replica that answers one is not asked the
# next).
SGLANG_PATH = "/get_server_info"
VLLM_DEV_PATH = "/server_info?config_format=json"
PATHS = (SGLANG_PATH, VLLM_DEV_PATH)


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

    def __init__(
        self, registry: ReplicaRegistry, session: aiohttp.ClientSession, timeout_s: float
    ) -> None:
        self.registry = registry
        self.session = session
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._missing: set[tuple[str, str]] = set()  # (replica URL, path) that answered 404

    async def learn(self, record: ReplicaRecord) -> int | None:
        """Ask ``record``'s engine its batch size; the router is told what it says. Returns
        the size, or None where it said none."""
        for path in PATHS:
            if (record.url, path) in self._missing:
                continue
            body = await self._get(record.url, path)
            size = batch_size_said(body)
            if size is not None:
                router = self.registry.router
                if router.has_replica(record.id):
                    router.observe_replica(record.id, max_running=size)
                return size
        return None

    async def _get(self, url: str, path: str) -> Any:
        try:
            async with self.session.get(url + path, timeout=self._timeout) as resp:
                if resp.status == 404:
                    self._missing.add((url, path))
                if resp.status != 200:
                    return None
                return json.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError):
            return None
