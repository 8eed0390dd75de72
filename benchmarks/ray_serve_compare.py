"""Ray Serve: our request router against Ray's own two, same deployment, same workload.

``make bench-ray`` (or ``.cache/ray-venv/bin/python benchmarks/ray_serve_compare.py``, in the
venv that ``make ray-setup`` builds: ray is not in the project's .venv).

One local Ray instance; one Serve deployment of emulated replicas (``emulated_deployment``: each
replica runs an emulated engine with its own KV cache, real-time prefill and decode), deployed
fresh for each router so every run starts with cold caches:

* ``p2c``: Ray's default, PowerOfTwoChoicesRequestRouter (the baseline);
* ``ray_prefix``: Ray's PrefixCacheAffinityRouter, its defaults (imported from
  ``ray.llm._internal...``: the public ``ray.serve.llm`` path needs pyarrow);
* ``ray_prefix_t10``: the same with ``imbalanced_threshold=10`` (Ray 2.60's default is
  infinity: it never falls back to load, however uneven the queues);
* ``prefixroute``: ``prefixroute.ray_serve.PrefixRouteRequestRouter``, default policy.

Workload: multi-turn conversations, each opening with one of a few shared system prompts; a
fixed number of clients each run whole conversations, turn after turn (the next turn carries the
reply), so the replicas are loaded the whole time. Requests stream, and TTFT is measured at the
client: from the handle call to the first event, so it includes routing and Serve's queueing.
Hit rate is the replicas' cached prompt tokens over prompt tokens, from each response's usage.
Ratios are against p2c measured in the same run. Seeded: the same prompts for every router.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

ROUTERS = ("p2c", "ray_prefix", "ray_prefix_t10", "prefixroute")
RAY_PREFIX_ROUTER = (
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router"
    ":PrefixCacheAffinityRouter"
)


@dataclass
class Result:
    router: str
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failed: int = 0
    wall_s: float = 0.0
    replicas: dict[str, int] = field(default_factory=dict)  # requests per replica

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttft_ms(self, q: float) -> float:
        xs = sorted(self.ttft_s)
        return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def conversations(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(system prompt, user turns) per conversation; word-level text, one token per word."""
    rng = random.Random(args.seed)

    def words(n: int) -> str:
        return " ".join(f"w{rng.randrange(50_000)}" for _ in range(n))

    systems = [words(args.system_words) for _ in range(args.system_prompts)]
    return [
        (systems[i % len(systems)], [words(args.user_words) for _ in range(args.turns)])
        for i in range(args.conversations)
    ]


async def run_router(router: str, args: argparse.Namespace) -> Result:
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from prefixroute.ray_serve import ChatRequest, emulated_deployment, router_config

    config: Any = None
    if router == "ray_prefix":
        config = RequestRouterConfig(request_router_class=RAY_PREFIX_ROUTER)
    elif router == "ray_prefix_t10":
        config = RequestRouterConfig(
            request_router_class=RAY_PREFIX_ROUTER,
            request_router_kwargs={"imbalanced_threshold": 10},
        )
    elif router == "prefixroute":
        config = router_config()
    app = emulated_deployment(
        num_replicas=args.replicas,
        request_router_config=config,
        max_ongoing_requests=args.max_ongoing,
    )
    handle = serve.run(app, name=f"bench-{router.replace('_', '-')}", route_prefix=None)
    stream = handle.options(stream=True, method_name="stream")
    result = Result(router)
    queue: asyncio.Queue[tuple[str, list[str]]] = asyncio.Queue()
    for conv in conversations(args):
        queue.put_nowait(conv)

    async def one(messages: list[dict[str, str]]) -> str:
        started = time.perf_counter()
        first: float | None = None
        final: dict[str, Any] = {}
        async for event in stream.remote(ChatRequest(list(messages), args.max_tokens)):
            if first is None:
                first = time.perf_counter() - started
            final = event
        assert first is not None
        result.ttft_s.append(first)
        usage = final["usage"]
        result.prompt_tokens += usage["prompt_tokens"]
        result.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
        result.replicas[final["replica"]] = result.replicas.get(final["replica"], 0) + 1
        return str(final["text"])

    async def client() -> None:
        while not queue.empty():
            system, turns = queue.get_nowait()
            messages = [{"role": "system", "content": system}]
            for user in turns:
                messages.append({"role": "user", "content": user})
                try:
                    reply = await one(messages)
                except Exception as exc:  # count and go on: a benchmark reports, never hides
                    result.failed += 1
                    print(f"  {router}: request failed: {type(exc).__name__}: {exc}")
                    break
                messages.append({"role": "assistant", "content": reply})

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(args.clients)))
    result.wall_s = time.perf_counter() - started
    serve.delete(f"bench-{router.replace('_', '-')}")
    return result


def table(results: list[Result]) -> str:
    base = next((r for r in results if r.router == "p2c"), results[0])
    lines = [
        f"| router | requests | failed | hit % | TTFT p50 ms | p99 ms | wall s "
        f"| hit vs {base.router} | p50 vs {base.router} | p99 vs {base.router} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        p50, p99 = r.ttft_ms(0.50), r.ttft_ms(0.99)
        lines.append(
            f"| {r.router} | {len(r.ttft_s)} | {r.failed} | {100 * r.hit_rate:.1f} "
            f"| {p50:.0f} | {p99:.0f} | {r.wall_s:.1f} "
            f"| {r.hit_rate / base.hit_rate:.2f}x | {p50 / base.ttft_ms(0.5):.2f}x "
            f"| {p99 / base.ttft_ms(0.99):.2f}x |"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--routers", default=",".join(ROUTERS), help="comma list: " + ", ".join(ROUTERS))
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--system-words", type=int, default=1500, help="tokens per system prompt")
    p.add_argument("--user-words", type=int, default=150, help="tokens per user message")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    p.add_argument("--clients", type=int, default=16, help="conversations in progress at once")
    p.add_argument("--max-ongoing", type=int, default=16, help="Serve max_ongoing_requests")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> list[Result]:
    results = []
    for router in [r.strip() for r in args.routers.split(",") if r.strip()]:
        if router not in ROUTERS:
            raise SystemExit(f"unknown router {router!r}; valid: {', '.join(ROUTERS)}")
        print(f"# {router} ...", flush=True)
        results.append(await run_router(router, args))
        r = results[-1]
        print(f"  done in {r.wall_s:.1f} s; requests per replica {sorted(r.replicas.values())}")
    return results


def main(argv: list[str] | None = None) -> None:
    warnings.simplefilter("ignore", DeprecationWarning)  # ray's own, at import
    import ray
    from ray import serve

    args = parse(argv)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(http_options={"location": "NoServer"})
        results = asyncio.run(amain(args))
    finally:
        serve.shutdown()
        ray.shutdown()
    n = args.conversations * args.turns
    print(
        f"\n{args.replicas} emulated replicas, {args.conversations} conversations x "
        f"{args.turns} turns ({n} requests), {args.system_prompts} system prompts of "
        f"{args.system_words} tokens, {args.user_words}-token user turns, {args.max_tokens} "
        f"output tokens, {args.clients} clients, max_ongoing_requests {args.max_ongoing}\n"
    )
    print(table(results))
    if statistics.fmean(len(r.ttft_s) for r in results) < n:
        print("\n(some requests failed: see above)")


if __name__ == "__main__":
    main()
