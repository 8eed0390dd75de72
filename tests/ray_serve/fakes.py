"""Stand-ins for Ray's replica wrappers and pending requests, to drive the router directly.

The router's hooks are plain methods; Ray calls them from its routing loop. Calling them here,
in the order Ray does, checks the bookkeeping exactly, with no cluster and no timing.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.request_router import PendingRequest, ReplicaID

from prefixroute.ray_serve import ChatRequest, PrefixRouteRequestRouter

DEPLOYMENT = DeploymentID(name="emulated", app_name="app")
_ids = itertools.count()


@dataclass(eq=False)
class FakeReplica:
    """What Ray's router reads from a ``RunningReplica``."""

    name: str
    max_ongoing_requests: int = 16
    routing_stats: dict[str, Any] = field(default_factory=dict)
    queue_len: int = 0

    @property
    def replica_id(self) -> ReplicaID:
        return ReplicaID(unique_id=self.name, deployment_id=DEPLOYMENT)

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def make_router(**kwargs: Any) -> PrefixRouteRequestRouter:
    """A router as Ray builds one: constructed, then ``initialize_state(**kwargs)``."""
    router = PrefixRouteRequestRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.UNKNOWN,
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(**kwargs)
    return router


def pending(*args: Any, **kwargs: Any) -> PendingRequest:
    """A pending request with a fresh id (call inside a running event loop)."""
    n = next(_ids)
    meta = RequestMetadata(request_id=f"req-{n}", internal_request_id=f"internal-{n}")
    return PendingRequest(args=list(args), kwargs=kwargs, metadata=meta)


def chat(*turns: str, system: str = "You are a terse assistant. " * 20) -> ChatRequest:
    """A chat request: the system prompt, then user/assistant turns alternating."""
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return ChatRequest(messages, max_tokens=8)


async def settle() -> None:
    """Let the future callbacks the router scheduled run (they are ``call_soon``)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def send(router: Any, pool: list[Any], request: Any) -> tuple[Any, Any]:
    """Route ``request`` as Ray does and send it to our first choice; (pending, replica)."""
    pr = pending(request)
    ranks = await router.choose_replicas(pool, pr)
    chosen = ranks[0][0]
    pr.future.set_result(chosen)
    router.on_request_routed(pr, chosen.replica_id, None)
    await settle()
    return pr, chosen
