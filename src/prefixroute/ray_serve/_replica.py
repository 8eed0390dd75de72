"""An emulated LLM replica as a Ray Serve deployment: one emulated engine per Serve replica.

Each Serve replica runs the simulator's replica model in real time (``prefixroute.emulate``'s
``EngineLoop``) inside its own process, so each has its own KV cache, prefix cache, batching and
prefill/decode timing, with no GPU and no model. That is what a router comparison needs: the
hit rate comes from the replicas' own caches, not from what a router believes.

A response carries what a vLLM response would (``usage.prompt_tokens_details.cached_tokens``)
plus the replica's name and its own time to first token, measured from arrival at the engine.
``stream`` yields two events, at the first token and at the end, so a caller can time the first
token end to end without one event per token over Ray.

Deploy it with :func:`prefixroute.ray_serve.emulated_deployment` or wrap the class yourself::

    app = serve.deployment(EmulatedServeReplica, num_replicas=4).bind()
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.exceptions import RayServeException

from prefixroute.core.prompt_key import field_of
from prefixroute.emulate import (
    ABORTED,
    FINISHED,
    EmulateError,
    Endpoint,
    EngineLoop,
    EngineStopped,
    parse_request,
)
from prefixroute.sim.replica import ReplicaConfig, ReplicaModel

SERVED_MODEL = "emulated"  # never checked: the body built from a request names no model


class EmulatedServeReplica:
    """One emulated engine; ``__call__`` answers whole, ``stream`` yields first token and end."""

    def __init__(
        self, engine: ReplicaConfig | None = None, time_scale: float = 1.0, hash_seed: int = 0
    ) -> None:
        self.engine = EngineLoop(ReplicaModel(engine or ReplicaConfig(), hash_seed), time_scale)
        self.name = _replica_name()

    async def __call__(self, request: object) -> dict[str, Any]:
        out: dict[str, Any] = {}
        async for event in self.stream(request):
            out.update(event)
        return out

    async def stream(self, request: object) -> AsyncIterator[dict[str, Any]]:
        # The engine's step loop lives on the loop that serves requests, started by the first.
        self.engine.start()
        tokens, max_tokens = prompt_of(request)
        started = time.perf_counter()
        gen = self.engine.submit(tokens, max_tokens)
        try:
            generated = 0
            while (item := await gen.queue.get()) != FINISHED:
                if item == ABORTED:
                    raise EngineStopped("the emulated engine stopped before the request finished")
                if generated == 0:
                    yield {"replica": self.name, "ttft_s": time.perf_counter() - started}
                generated = item
            yield {
                "replica": self.name,
                "text": " lorem" * generated,  # one token per word, as the emulator's filler
                "usage": {
                    "prompt_tokens": len(tokens),
                    "completion_tokens": generated,
                    "total_tokens": len(tokens) + generated,
                    "prompt_tokens_details": {"cached_tokens": gen.cached_tokens},
                },
            }
        finally:
            self.engine.release(gen)

    def record_routing_stats(self) -> dict[str, float]:
        """Ray polls this (``request_routing_stats_period_s``); our router's load view reads it."""
        model = self.engine.model
        return {
            "num_running": model.num_running,
            "num_waiting": model.num_waiting,
            "kv_usage": model.kv_usage,
        }


def prompt_of(request: object) -> tuple[list[int], int]:
    """Prompt token ids and output length of a chat or completion request (object or dict).

    The request's fields become an OpenAI body, read by the emulated server's own parser, so a
    Serve replica accepts and rejects exactly what ``prefixroute emulate`` does; a rejection is
    a ``ValueError`` here (there is no HTTP status to give it).
    """
    body = {
        name: value
        for name in ("messages", "prompt", "max_tokens", "max_completion_tokens")
        if (value := field_of(request, name)[1]) is not None
    }
    endpoint = Endpoint.CHAT if "messages" in body else Endpoint.COMPLETIONS
    try:
        parsed = parse_request(endpoint, body, SERVED_MODEL)
    except EmulateError as exc:
        raise ValueError(str(exc)) from None
    return parsed.tokens, parsed.max_tokens


def _replica_name() -> str:
    """The Serve replica's id within its deployment (the id our router uses), or "local"."""
    try:
        return str(serve.get_replica_context().replica_id.unique_id)
    except RayServeException:  # outside a Serve replica (a test, a plain actor)
        return "local"
