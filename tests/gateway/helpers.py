"""Client-side helpers for gateway tests: send one request, read it to the end, summarise; the
article's conversation (``article_chat``), whatever it goes through."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import aiohttp

from prefixroute.core import ReplicaId
from prefixroute.emulate import EmulatedCluster, EmulatorConfig
from prefixroute.events import StreamState
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.sim.replica import ReplicaConfig

from .fakes import FakeReplica

# Block size 1 makes cache counts token-exact; time runs 100x faster than real time.
FAST_REPLICA = EmulatorConfig(ReplicaConfig(block_size=1), time_scale=0.01)
# Fast health checking so ejection and readmission take tens of milliseconds. Replicas are
# named by URL in the answers' headers, so tests can tell which fake served them.
FAST_GATEWAY = GatewayConfig(
    port=0,
    expose_replica_urls=True,
    health_interval_s=0.05,
    health_timeout_s=0.2,
    eject_s=0.1,
    read_timeout_s=5.0,
    connect_timeout_s=1.0,
    shutdown_timeout_s=5.0,
)

ClusterFactory = Callable[..., Awaitable[EmulatedCluster]]
GatewayFactory = Callable[..., Awaitable[Gateway]]
GatewayOf = Callable[..., Awaitable[Gateway]]  # (n replicas, **settings): a gateway over them
FakeFactory = Callable[..., Awaitable[FakeReplica]]  # FakeReplica's arguments: a started one


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any  # parsed JSON (plain), or the list of parsed data events (stream)
    usage: dict[str, Any] | None
    done: bool  # a stream ended with data: [DONE] (plain: always True)
    error: dict[str, Any] | None  # an error body or error event
    text: str  # assistant text (completion text or chat content)

    @property
    def uncached(self) -> int:
        assert self.usage is not None, self
        return int(
            self.usage["prompt_tokens"] - self.usage["prompt_tokens_details"]["cached_tokens"]
        )

    @property
    def complete(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.usage is not None


def parse_stream(raw: str) -> tuple[list[Any], bool]:
    events: list[Any] = []
    done = False
    for block in raw.split("\n\n"):
        for line in block.splitlines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
    return events, done


async def send(
    session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], **kw: Any
) -> Reply:
    """POST ``body``; a stream asks for its usage, as a client that counts tokens does (the
    gateway keeps usage it asked for itself from the client: test_stream_usage.py)."""
    if body.get("stream") is True and "stream_options" not in body:
        body = {**body, "stream_options": {"include_usage": True}}
    async with session.post(url + path, json=body, **kw) as resp:
        raw = await resp.text()
        headers = dict(resp.headers)
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            events, done = parse_stream(raw)
            usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
            error = next((e["error"] for e in events if "error" in e), None)
            text = "".join(
                c.get("text") or c.get("delta", {}).get("content") or ""
                for e in events
                for c in e.get("choices", [])
            )
            return Reply(resp.status, headers, events, usage, done, error, text)
        obj = json.loads(raw) if raw else None
        error = obj.get("error") if isinstance(obj, dict) else None
        usage = obj.get("usage") if isinstance(obj, dict) else None
        text = ""
        if isinstance(obj, dict) and obj.get("choices"):
            c = obj["choices"][0]
            text = c.get("text") or c.get("message", {}).get("content") or ""
        return Reply(resp.status, headers, obj, usage, True, error, text)


def words(n: int) -> str:
    """The article's prompts: ``w0 w1 ... w{n-1}``; each is a prefix of any longer one."""
    return " ".join(f"w{i}" for i in range(n))


# The article's conversation: words in each turn's prompt (each prompt a prefix of the next).
TURNS = (400, 700, 1000, 1400, 1700)
R = TypeVar("R")


async def article_chat(
    turn: Callable[[int, dict[str, Any]], Awaitable[tuple[R, str]]], **fields: Any
) -> tuple[list[R], list[dict[str, str]]]:
    """The article's conversation as chat: turn ``i``'s body (the history, then the words up to
    ``TURNS[i]``; ``fields`` added) goes to ``turn(i, body)``, which sends it and returns the
    reply and the answer's text, the history's next message. Returns the replies and the
    history."""
    messages: list[dict[str, str]] = []
    replies: list[R] = []
    start = 0
    for i, n in enumerate(TURNS):
        messages.append({"role": "user", "content": " ".join(f"w{w}" for w in range(start, n))})
        start = n
        body = {"model": "emulated", "messages": messages, "max_tokens": 4, **fields}
        reply, answer = await turn(i, body)
        replies.append(reply)
        messages.append({"role": "assistant", "content": answer})
    return replies, messages


async def chat_turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[Reply, str]:
    """One chat turn through the gateway at ``url``, answered whole: the reply and its text."""
    reply = await send(session, url, "/v1/chat/completions", body)
    assert reply.complete, reply
    return reply, reply.text


def question(name: str, turn: int) -> dict[str, str]:
    """Turn ``turn`` of conversation ``name``: a user message of 300 words no other has."""
    return {"role": "user", "content": " ".join(f"{name}{turn}w{i}" for i in range(300))}


# For tests that are not about health checking: probes that tolerate a loaded machine, so a slow
# probe never takes the only replica out in the middle of a test (make_gateway(..., **STEADY)).
STEADY: dict[str, Any] = {"health_timeout_s": 5.0, "failure_threshold": 1000}


async def read_until(stream: asyncio.StreamReader, pattern: str, seen: list[str]) -> re.Match[str]:
    """Read a process's log lines, keeping them in ``seen``, until one matches ``pattern``."""
    while True:
        line = (await stream.readline()).decode()
        if not line:
            raise AssertionError("the process ended early:\n" + "".join(seen))
        seen.append(line)
        if match := re.search(pattern, line):
            return match


class _Threaded(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Threaded)


def running(servers: S) -> Iterator[S]:
    """``servers`` started for a fixture's lifetime: ``yield from running(Servers())``."""
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


def basic(user: str, password: str) -> dict[str, str]:
    """An HTTP Basic ``Authorization`` header."""
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def wrong_credentials(token: str) -> list[dict[str, str]]:
    """Headers that must not pass for admin ``token``: none, a wrong bearer, the token without
    a scheme, Basic with it undecoded, with a wrong password, as the user name, not base64."""
    return [
        {},
        {"Authorization": "Bearer wrong-token-123"},
        {"Authorization": token},
        {"Authorization": f"Basic {token}"},
        basic("admin", "wrong-token-123"),
        basic(token, ""),  # the token as the user name is not the password
        {"Authorization": "Basic !!!not-base64"},
    ]


async def reset_until_live(
    session: aiohttp.ClientSession,
    urls: Iterable[str],
    streams_of: Callable[[ReplicaId], Iterable[Any]],
    timeout_s: float = 10.0,
) -> None:
    """Reset each replica's prefix cache until every KV-event stream from it (``streams_of``
    its id: one per gateway or picker listening) is live, i.e. its AllBlocksCleared got
    through: connected, and in step. Fails after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for url in urls:
        while any(s.state is not StreamState.LIVE for s in streams_of(ReplicaId(url))):
            assert loop.time() < deadline, f"{url}'s events never came"
            async with session.post(url + "/reset_prefix_cache") as resp:
                assert (await resp.json())["success"]
            await asyncio.sleep(0.01)


def counter(text: str, name: str) -> float:
    """A counter's total over its labels in a /metrics page."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{.*}})? (\S+)$", text, re.M))


async def metrics_page(session: aiohttp.ClientSession, gw: Gateway) -> str:
    """The gateway's /metrics page."""
    async with session.get(gw.url + "/metrics") as resp:
        return await resp.text()


async def post_json(
    session: aiohttp.ClientSession, url: str, body: object, **kw: Any
) -> tuple[int, dict[str, str], str]:
    """POST ``body`` as JSON: (status, headers, the answer's text)."""
    async with session.post(url, json=body, **kw) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def wait_answering(url: str, tries: int = 300) -> None:
    """Until the replica at ``url`` (a process just started) answers ``/v1/models`` with a 200:
    at most ``tries`` looks, 50 ms apart."""
    async with aiohttp.ClientSession() as http:
        for _ in range(tries):
            try:
                async with http.get(url + "/v1/models") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
