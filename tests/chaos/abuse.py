"""Scenarios where clients misbehave: poison bodies, path tricks, slow readers.

* **poison**: ``per_kind`` requests of each kind in :mod:`.poison`, with a canary every
  ``canary_interval_s`` that must get a 200 every time. Targets: no replica ejected, the canary
  never fails, every poison request answered (a 200 or a JSON 4xx counts as ``ok``).
* **paths**: dot-segment, percent-encoded, double-encoded, doubled-slash and backslash forms of
  paths outside the gateway's allowlist, sent on raw sockets so nothing normalises them. Targets:
  each gets a JSON 404, and none reaches a replica: a :class:`Tap` in front of each replica sees
  every request (the probes carry a marker header), and the replicas' own token counters on
  ``/metrics`` must not move (the emulated replica counts tokens, not requests).
* **slow readers**: with ``max_in_flight_per_replica`` 4, ``readers`` clients each ask for a
  long stream (2,000 tokens, about 480 KB) and read it at one byte a second through a small
  receive buffer and an Ethernet-sized MSS (see :class:`SlowReader`). Targets: the
  gateway's in-flight count (``prefixroute_in_flight``) falls to 0 within ``release_bound_s``
  of the replicas' engines finishing (``vllm:num_requests_running`` + ``waiting`` at 0), and
  a canary sent after that, while the readers are still connected, is served.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

from .clients import (
    CHAT,
    MODEL,
    Canary,
    Kind,
    Outcome,
    SlowReader,
    post,
    raw_bytes,
    raw_request,
    session,
)
from .harness import EjectionWatcher, Fleet, Result, total
from .poison import KINDS

PROBE_HEADER = "X-Chaos-Probe"  # marks the paths scenario's requests, seen at the taps
TOKEN_COUNTERS = ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total",
                  "vllm:generation_tokens_total")  # fmt: skip


async def poison(
    log_dir: Path,
    *,
    per_kind: int = 100,
    concurrency: int = 8,
    canary_interval_s: float = 0.05,
    timeout_s: float = 15.0,
) -> Result:
    result = Result("poison")
    statuses: dict[str, Counter[str]] = {kind: Counter() for kind in KINDS}
    dropped: Counter[str] = Counter()  # why requests were lost or hung
    # The canary is another client, with connections of its own: a poison request that gets
    # its connection closed must not take a canary's request down with it.
    async with Fleet(log_dir) as fleet, session() as client, session() as canary_client:
        gate = asyncio.Semaphore(concurrency)

        async def one(kind: str, i: int) -> tuple[str, Outcome]:
            body, headers = KINDS[kind][i % len(KINDS[kind])]
            async with gate:
                return kind, await post(
                    client, fleet.url + CHAT, body, headers=headers, timeout_s=timeout_s
                )

        async with (
            EjectionWatcher(fleet) as watcher,
            Canary(canary_client, fleet.url, canary_interval_s) as canary,
        ):
            jobs = [one(kind, i) for i in range(per_kind) for kind in KINDS]
            outcomes = await asyncio.gather(*jobs)
        failures = sum(r["total_failures"] for r in await fleet.admin_replicas())
    for kind, o in outcomes:
        result.sent += 1
        statuses[kind][str(o.status or o.kind.value)] += 1
        if o.kind is Kind.HUNG:
            result.hung += 1
            dropped[o.detail] += 1
        elif o.kind is Kind.LOST or (o.kind is Kind.ERROR and o.status >= 400 and not o.json_body):
            result.lost += 1  # dropped, or an error answer that was not JSON
            dropped[o.detail] += 1
        elif o.kind is Kind.OK or 400 <= o.status < 500:
            result.ok += 1  # served, or refused with a JSON 4xx
        else:
            result.cut_with_error += 1
    result.finish(watcher)
    result.notes.append(f"{per_kind} of each of {len(KINDS)} kinds")
    result.notes.append(
        "statuses: "
        + ", ".join(
            f"{kind} " + "/".join(f"{s}x{n}" for s, n in c.most_common())
            for kind, c in statuses.items()
        )
    )
    result.notes.append(f"replica failures blamed (admin API): {failures}")
    if dropped:
        result.notes.append("lost/hung: " + ", ".join(f"{w} x{n}" for w, n in dropped.items()))
    result.count_canary(canary, "canary 200 throughout")
    result.check(result.ejections == 0, "0 replicas ejected")
    result.check(result.hung == 0 and result.lost == 0, "every poison request answered")
    return result


DOTS = ("..", "%2e%2e", "%2E%2E", "%2e.", ".%2e", "%2E.", ".%2E", "%252e%252e", "%252E%252E")
SEPARATORS = ("/", "%2f", "%2F", "\\", "%5c", "%5C")
HIDDEN = ("reset_prefix_cache", "metrics", "health")  # replica endpoints not in the allowlist


def traversal_paths() -> list[str]:
    """Every form of stepping out of ``/v1/`` (or dodging its routes) the suite knows."""
    paths = [f"/v1/{dots}{sep}{hidden}" for dots in DOTS for sep in SEPARATORS for hidden in HIDDEN]
    paths += [f"/v1/chat/{dots}/completions" for dots in DOTS]
    paths += [f"/v1/models/{dots}/{dots}/metrics" for dots in DOTS]
    paths += [f"/v1/{dots}" for dots in DOTS]
    paths += [f"/v1//{hidden}" for hidden in HIDDEN] + [f"//v1/../{h}" for h in HIDDEN]
    paths += [f"/v1/./../{h}" for h in HIDDEN] + [f"/v1/%2e/%2e%2e/{h}" for h in HIDDEN]
    paths += [f"/v1\\..\\{h}" for h in HIDDEN] + [f"/v1/..;/{h}" for h in HIDDEN]
    paths += ["/v1/chat/completions/../../../reset_prefix_cache", "/v1/chat/./completions",
              "/v1/./chat/completions", "/v1/%2e/models"]  # fmt: skip
    return paths


async def paths(log_dir: Path, *, concurrency: int = 8) -> Result:
    result = Result("paths")
    body = json.dumps({"model": MODEL, "prompt": "probe", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "probe"}]}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json", PROBE_HEADER: "1"}
    misses: Counter[str] = Counter()
    examples: list[str] = []
    proxied = 0
    async with Fleet(log_dir, tap=True) as fleet:
        before = [await fleet.replica_metrics(i) for i in range(fleet.n)]
        gate = asyncio.Semaphore(concurrency)

        async def one(method: str, path: str) -> None:
            nonlocal proxied
            request = raw_bytes(method, path, body if method == "POST" else b"", headers)
            async with gate:
                resp = await raw_request(fleet.gateway_port, request)
            result.sent += 1
            if resp is None:
                result.lost += 1
                verdict = "no answer"
            else:
                js = resp.json()
                verdict = f"{resp.status}{' JSON' if isinstance(js, dict) else ' non-JSON'}"
                proxied += "x-prefixroute-replica" in resp.headers
            if verdict == "404 JSON":
                result.ok += 1
                return
            misses[verdict] += 1
            if len(examples) < 4:
                examples.append(f"{method} {path} -> {verdict}")

        await asyncio.gather(*(one(m, p) for p in traversal_paths() for m in ("GET", "POST")))
        await asyncio.sleep(0.2)  # anything still on its way to a replica arrives
        after = [await fleet.replica_metrics(i) for i in range(fleet.n)]
        reached = [s for tap in fleet.taps for s in tap.seen if PROBE_HEADER.lower() in s.headers]
    moved = sum(total(a, name) - total(b, name)
                for a, b in zip(after, before, strict=True) for name in TOKEN_COUNTERS)  # fmt: skip
    result.finish()
    result.notes.append(f"{len(traversal_paths())} paths x GET/POST")
    if misses:
        result.notes.append("not 404 JSON: " + ", ".join(f"{v} x{n}" for v, n in misses.items()))
        result.notes.append("e.g. " + "; ".join(examples))
    seen = Counter(f"{s.method} {s.target}" for s in reached)
    result.notes.append(
        f"reached a replica: {len(reached)} (answered by one: {proxied}; replica token "
        f"counters moved by {moved:.0f})" + (": " + ", ".join(list(seen)[:4]) if seen else "")
    )
    result.check(not misses, "every one a JSON 404")
    result.check(not reached and moved == 0, "nothing reaches a replica")
    return result


async def slow_readers(
    log_dir: Path,
    *,
    readers: int = 16,
    max_tokens: int = 2000,
    decode_step_s: float = 0.002,
    release_bound_s: float = 1.0,
    canary_s: float = 5.0,
    canary_interval_s: float = 0.25,
) -> Result:
    result = Result("slow readers")
    body = json.dumps(
        {
            "model": MODEL,
            "max_tokens": max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": "a long story"}],
        }
    ).encode()
    request = raw_bytes("POST", CHAT, body, {"Content-Type": "application/json"})
    settings = {"max_in_flight_per_replica": 4}
    replica_args = ["--decode-step", str(decode_step_s)]
    delay: float | None = None
    async with Fleet(log_dir, replica_args=replica_args, settings=settings) as fleet:
        stop = asyncio.Event()
        slow = [SlowReader(fleet.gateway_port, request) for _ in range(readers)]
        tasks = [asyncio.create_task(r.run(stop)) for r in slow]
        try:
            generation_s = max_tokens * decode_step_s * 3 + 10
            t_end = await _engines_idle(fleet, generation_s)
            while delay is None and time.monotonic() < t_end + 10:
                if total(await fleet.gateway_metrics(), "prefixroute_in_flight") == 0:
                    delay = time.monotonic() - t_end
                await asyncio.sleep(0.05)
            async with session() as client, Canary(client, fleet.url, canary_interval_s) as canary:
                await asyncio.sleep(canary_s)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    served = sum(1 for r in slow if r.received > 0)
    cut = sum(1 for r in slow if r.closed_by_server)
    result.sent, result.ok, result.lost = readers, served, readers - served
    result.finish()
    shown = "never (10 s)" if delay is None else f"{delay:.2f} s"
    result.notes.append(
        f"gateway in-flight at 0 after the engines finished: {shown}; readers cut by the "
        f"gateway: {cut}, got {min(r.received for r in slow)}-{max(r.received for r in slow)} B"
    )
    result.count_canary(canary, "canary served")
    result.check(delay is not None and delay <= release_bound_s,
                 f"in-flight released within {release_bound_s:.0f} s")  # fmt: skip
    return result


async def _engines_idle(fleet: Fleet, timeout_s: float) -> float:
    """When every replica's engine had nothing running or waiting, after having had work."""
    deadline = time.monotonic() + timeout_s
    busy = False
    while time.monotonic() < deadline:
        samples = [await fleet.replica_metrics(i) for i in range(fleet.n)]
        work = sum(total(s, "vllm:num_requests_running") + total(s, "vllm:num_requests_waiting")
                   for s in samples)  # fmt: skip
        if work:
            busy = True
        elif busy:
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the replicas' engines were not idle within {timeout_s:.0f} s")
