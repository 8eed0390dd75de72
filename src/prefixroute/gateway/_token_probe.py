"""A fresh gateway's characters per token, asked of a replica before any answer can tell.

Approximate mode turns a prompt's characters into the engine's tokens at a ratio learned from
each answer's usage (``core/token_count.py``). Usage comes at an answer's end, so a burst that
reaches a fresh gateway (or the first requests for a new model) was all routed at the prior of
4 characters a token: ``prefixroute bench -w shared-prefix`` with 32 requests predicted 172,032
cached tokens where the replicas reported 57,344 (issue 11), which the policies weigh against
queues in the wrong unit.

vLLM and SGLang both count a prompt's tokens on ``POST /tokenize`` (``{"model", "prompt"}`` in,
``{"count", "tokens", ...}`` out), in their API server, without the engine: milliseconds even
while it is busy. So the first text request of a model whose ratio nobody has told yet starts
one probe: the healthy replica serving that model with the fewest requests in flight counts
the request's routing text (its first ``PROBE_CHARS`` characters: a sample), and the count
teaches the ratio as a short answer's usage would (``Router.observe_token_count``, weighed as
at most ``PROBE_WEIGHT`` tokens, so that real answers soon outweigh one odd first prompt).
The routing text, not the chat the replica will render: that is the text whose characters the
router converts, and the template's few tokens are left to the answers' usage.

Requests of that model wait for the probe until ``PROBE_WAIT_S`` after it started; later ones
do not wait at all. Texts under ``MIN_PROBE_CHARS`` are not asked about (nor wait). A replica
without ``/tokenize`` (404, or any other answer but a count) or one that fails leaves the
model at the prior until usage teaches it; the probe is tried again after ``PROBE_RETRY_S``,
``PROBE_TRIES`` times in all, while nothing has. A model no replica serves is not asked (the
request gets its 404), and at most ``MAX_MODELS`` models are kept on record, since their names
are the clients' bytes. Both front ends key requests through ``GatewayState.route_key``, which
asks here: ``serve`` and the endpoint picker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import Counter

from prefixroute.core import PrefixrouteError, ReplicaId, RouteKey
from prefixroute.gateway._registry import ReplicaRegistry

log = logging.getLogger(__name__)

PROBE_PATH = "/tokenize"
PROBE_CHARS = 4096  # characters of routing text sent: a sample, about a thousand tokens
# A count weighs as a prompt of at most this many tokens: it replaces the prior (64) and is
# outweighed by the first real answers' usage, so one odd first prompt (a client's "," x 4096:
# 1 character a token, told as the model's ratio) sets the model's ratio for one answer or two,
# not for the 40-odd answers a 4,096-token sample would outweigh (security audit, issue 11).
PROBE_WEIGHT = 256
MAX_MODELS = 256  # models with a probe on record; more (a replica serving any name) go unasked
# A shorter text is not asked about: its few tokens (a "Hello" of 5 characters, 2 tokens) would
# weigh less than the prior and leave the ratio at 4 with the model marked known, and its own
# cost (a block or two) hardly depends on the ratio. The next longer text is asked instead.
MIN_PROBE_CHARS = 1024
# A /tokenize answer takes milliseconds; the first requests of a model wait this long at most,
# seconds (then go on at the prior, and the probe still teaches when it answers).
PROBE_WAIT_S = 0.25
PROBE_RETRY_S = 30.0  # a failed probe is tried again this much later, seconds
PROBE_TRIES = 3  # probes per model in all, while no usage has taught it


@dataclass(slots=True)
class _Probe:
    """One model's probes: the one under way (``done`` not set) or the last one's outcome."""

    tries: int = 0
    next_at: float = 0.0  # monotonic time before which no new probe starts, seconds
    wait_until: float = 0.0  # monotonic time past which no request waits for it, seconds
    done: asyncio.Event = field(default_factory=asyncio.Event)


class TokenProbe:
    """Asks a replica's ``/tokenize`` for each model's characters per token (module docstring)."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        session: aiohttp.ClientSession,
        counter: Counter,
        timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.registry = registry
        self.router = registry.router
        self.session = session
        self.counter = counter  # prefixroute_token_probes_total{outcome}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}
        self._probes: dict[str | None, _Probe] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def ready(self, key: RouteKey) -> None:
        """Return once ``key``'s model has a told ratio, or its probe had ``PROBE_WAIT_S``."""
        text = key.text
        if text is None or len(text) < MIN_PROBE_CHARS or key.tokens is not None:
            return  # token ids count exactly; a short text (or none: load alone) is not asked
        if self.router.knows_chars_per_token(key.model):
            return
        probe = self._probes.get(key.model)
        if probe is not None and not probe.done.is_set():
            return await self._wait(probe)
        if probe is not None and (probe.tries >= PROBE_TRIES or time.monotonic() < probe.next_at):
            return  # the last one failed: again later, a few times
        replica = self._replica_for(key.model)
        if replica is None:  # a model no replica serves (the request gets its 404), or none up
            return
        if probe is None:
            if len(self._probes) >= MAX_MODELS:  # the names are the clients': a bounded table
                return
            probe = self._probes[key.model] = _Probe()
        probe.done = asyncio.Event()
        probe.wait_until = time.monotonic() + PROBE_WAIT_S
        probe.tries += 1
        task = asyncio.get_running_loop().create_task(self._run(key, replica, probe))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await self._wait(probe)

    def _replica_for(self, model: str | None) -> ReplicaId | None:
        """The healthy replica serving ``model`` with the fewest requests in flight."""
        try:
            candidates = self.registry.candidates(model)
        except PrefixrouteError:
            return None
        return min(candidates, key=self.registry.in_flight)

    @staticmethod
    async def _wait(probe: _Probe) -> None:
        """Wait for ``probe`` until ``PROBE_WAIT_S`` after it started: a slow one holds the
        requests of its first quarter second, not every request until it times out."""
        left = probe.wait_until - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probe.done.wait(), left)

    async def _run(self, key: RouteKey, replica: ReplicaId, probe: _Probe) -> None:
        outcome = "failed"
        try:
            outcome = await self._ask(key.model, replica, (key.text or "")[:PROBE_CHARS])
        finally:
            probe.next_at = time.monotonic() + PROBE_RETRY_S
            probe.done.set()
            self.counter.labels(outcome).inc()

    async def _ask(self, model: str | None, replica: ReplicaId, sample: str) -> str:
        """One probe of ``replica``; returns its outcome: learned, unsupported or failed."""
        body: dict[str, object] = {"prompt": sample}
        if model is not None:
            body["model"] = model
        url = replica + PROBE_PATH  # its id is its base URL (a lookup failed once it was removed)
        try:
            async with self.session.post(
                url, json=body, headers=self.headers, timeout=self.timeout
            ) as resp:
                if resp.status != 200:
                    log.info("%s answered %d: characters per token left to usage", url, resp.status)
                    return "unsupported"
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.info("%s failed (%s): characters per token left to usage", url, exc)
            return "failed"
        count = _count_of(answer)
        if count is None:
            return "unsupported"
        self.router.observe_token_count(model, len(sample), count, min(count, PROBE_WEIGHT))
        return "learned"

    async def close(self) -> None:
        """Cancel the probes under way (the session is about to close)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _count_of(answer: object) -> int | None:
    """The token count of a ``/tokenize`` answer: its ``count``, else its ``tokens``' length
    (None when it has neither, or they say nothing)."""
    if not isinstance(answer, dict):
        return None
    count = answer.get("count")
    if not isinstance(count, int) or isinstance(count, bool):
        tokens = answer.get("tokens")
        count = len(tokens) if isinstance(tokens, list) else None
    return count if count is not None and count > 0 else None
