"""Our router inside a real local Ray Serve, in front of emulated replicas.

Each deployment's replicas run emulated engines with their own KV caches, so hit rates here are
what the replicas report. The router under test lives in this process (the driver's handle);
``router_of`` reaches it through Ray's private handle attributes, to read its bookkeeping.
Convergence after an asynchronous event (a completion notice, a scale change) is polled with a
generous bound; nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
from ray import serve

from prefixroute.core import ReplicaId
from prefixroute.ray_serve import (
    ChatRequest,
    PrefixRouteRequestRouter,
    UnroutableRequest,
    emulated_deployment,
    router_config,
)

from .support import MARKS

pytestmark = MARKS


def router_of(handle: Any) -> PrefixRouteRequestRouter:
    """The router this handle routes with (Ray internals; it exists once a request was sent)."""
    router = handle._router._asyncio_router.request_router
    assert isinstance(router, PrefixRouteRequestRouter)
    return router


async def eventually(check: Callable[[], bool], what: str, bound_s: float = 60.0) -> None:
    deadline = time.monotonic() + bound_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.1)


def deploy(name: str, **kwargs: Any) -> Any:
    return serve.run(emulated_deployment(**kwargs), name=name, route_prefix=None)


@pytest.fixture(scope="module")
def ours(ray_instance: None) -> Iterator[Any]:
    yield deploy("ours", num_replicas=3, request_router_config=router_config())
    serve.delete("ours")


def conversations(n: int, turns: int, seed: int = 0) -> list[list[str]]:
    """``n`` conversations over two shared system prompts: [system, user 1, user 2, ...].

    Prompts are long enough (600-token system prompts, 200-token turns, one token per word)
    that recomputing a conversation costs more than sharing a replica's decode steps: with
    short ones the default policy rightly moves turns to an idle replica.
    """
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(f"w{rng.randrange(10_000)}" for _ in range(k))

    systems = [words(600), words(600)]
    return [[systems[i % 2]] + [words(200) for _ in range(turns)] for i in range(n)]


async def replay(
    handle: Any, convs: list[list[str]], clients: int
) -> tuple[float, list[list[str]]]:
    """Run the conversations, ``clients`` at a time; (hit rate, replica of each turn)."""
    cached = prompt = 0
    where: list[list[str]] = [[] for _ in convs]
    todo = list(enumerate(convs))

    async def client() -> None:
        nonlocal cached, prompt
        while todo:
            i, (system, *users) = todo.pop(0)
            messages = [{"role": "system", "content": system}]
            for user in users:
                messages.append({"role": "user", "content": user})
                out = await handle.remote(ChatRequest(list(messages), max_tokens=4))
                messages.append({"role": "assistant", "content": out["text"]})
                cached += out["usage"]["prompt_tokens_details"]["cached_tokens"]
                prompt += out["usage"]["prompt_tokens"]
                where[i].append(out["replica"])

    await asyncio.gather(*(client() for _ in range(clients)))
    return cached / prompt, where


async def test_conversations_hit_the_cache_more_than_under_power_of_two(ours: Any) -> None:
    convs = conversations(8, turns=4)
    hit, where = await replay(ours, convs, clients=2)
    p2c = deploy("p2c", num_replicas=3)  # Ray's default router, same deployment
    try:
        p2c_hit, p2c_where = await replay(p2c, convs, clients=2)
    finally:
        serve.delete("p2c")
    later_turns = sum(len(w) - 1 for w in where)
    stayed = sum(sum(r == w[0] for r in w[1:]) for w in where)
    assert stayed >= 0.8 * later_turns, where
    assert hit > p2c_hit + 0.1, (hit, p2c_hit, p2c_where)


async def test_completions_release_the_load(ours: Any) -> None:
    convs = conversations(6, turns=1, seed=1)
    await replay(ours, convs, clients=6)
    router = router_of(ours)
    ledger = router.ledger
    await eventually(lambda: ledger.pending == 0, "every request released")
    assert all(ledger.in_flight(r) == 0 for r in ledger.router.replicas)
    assert len(ledger.router.replicas) == 3


async def test_a_request_without_prompt_or_messages_fails_fast(ours: Any) -> None:
    with pytest.raises(UnroutableRequest, match="'messages' or 'prompt'"):
        await asyncio.wait_for(ours.remote({"question": "where is my prompt?"}), 60)
    out = await asyncio.wait_for(ours.remote({"prompt": "still serving"}), 60)
    assert out["usage"]["prompt_tokens"] == 2


async def test_a_full_replica_spills_to_the_next_rank(ray_instance: None) -> None:
    # consistent_hash sends one prompt to one replica, always; with room for one request per
    # replica, the second copy can only run at once if Ray takes our second rank.
    handle = deploy(
        "cap",
        num_replicas=2,
        max_ongoing_requests=1,
        request_router_config=router_config(policy="consistent_hash"),
    )
    try:
        request = ChatRequest([{"role": "user", "content": "same prompt " * 50}], max_tokens=60)
        outs = await asyncio.gather(handle.remote(request), handle.remote(request))
        assert {o["replica"] for o in outs} == set(router_of(handle).ledger.router.replicas)
        ledger = router_of(handle).ledger
        await eventually(lambda: ledger.pending == 0, "both requests released")
    finally:
        serve.delete("cap")


async def test_the_replica_set_follows_scaling_and_a_death(ray_instance: None) -> None:
    config = router_config()
    handle = deploy("scale", num_replicas=2, request_router_config=config)
    try:
        await handle.remote({"prompt": "warm up"})
        ledger = router_of(handle).ledger

        def names() -> set[str]:
            return set(ledger.router.replicas)

        await eventually(lambda: len(names()) == 2, "2 replicas")
        deploy("scale", num_replicas=3, request_router_config=config)
        await eventually(lambda: len(names()) == 3, "3 replicas after scaling up")
        deploy("scale", num_replicas=2, request_router_config=config)
        await eventually(lambda: len(names()) == 2, "2 replicas after scaling down")

        doomed = sorted(names())[0]
        actor = ray.get_actor(f"SERVE_REPLICA::scale#emulated#{doomed}", namespace="serve")
        ray.kill(actor, no_restart=True)
        prompts = [{"prompt": f"after the death {i} " * 20, "max_tokens": 4} for i in range(8)]
        outs = await asyncio.gather(*(handle.remote(p) for p in prompts))
        assert doomed not in {o["replica"] for o in outs}
        await eventually(lambda: doomed not in names(), "the dead replica dropped")
        assert ReplicaId(doomed) not in ledger.router.index.replicas
    finally:
        serve.delete("scale")
