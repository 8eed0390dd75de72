"""Hostile input against a running gateway: hypothesis over bodies and headers, plus slow clients.

Setup (module scope): two gateways run in this process on an event loop of their own thread;
their replicas are ``prefixroute emulate`` subprocesses, as in production, so a replica busy
tokenizing a multi-million-character prompt cannot stall this process and blur what the
gateway itself does. ``fuzz`` has isolation, header tenants and limits; ``keyed`` requires API
keys. Requests go out over raw sockets, which can send anything: invalid UTF-8 in headers,
bodies that lie about their length, headers one byte at a time.

Every case must end in a normal answer or a clear 4xx (a JSON error body once the request got
past HTTP parsing) within ``BOUND_S``. A canary thread sends ordinary requests the whole time,
on a replica of its own (model ``canary``); the last tests check that none of them failed or
waited long, that nothing leaked (in-flight counts back to zero) and that memory stayed flat.

``PREFIXROUTE_FUZZ_SCALE=10 pytest tests/gateway/test_fuzz.py --hypothesis-show-statistics``
runs ten times the examples (the default run stays well under a minute).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixroute.gateway import (
    Gateway,
    GatewayConfig,
    TenancyConfig,
    TenantLimits,
    TenantSpec,
    hash_api_key,
)
from prefixroute.gateway._state import STATE
from prefixroute.gateway._tenants import TENANTS

from .helpers import running
from .rawhttp import exchange, split_answer

SCALE = int(os.environ.get("PREFIXROUTE_FUZZ_SCALE", "1"))
BOUND_S = 15.0  # longest any fuzz request may take, seconds
CANARY_BOUND_S = 3.0  # longest a canary request may take, seconds
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
KEY = "pr-" + "f" * 40
TOKEN = "fuzz-admin-token"


def fuzz_settings(examples: int) -> settings:
    """``examples`` cases (times PREFIXROUTE_FUZZ_SCALE), no per-example deadline."""
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=SCALE == 1,  # the default run is reproducible; longer runs explore
    )


T = TypeVar("T")


# --- the servers ------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_replica(model: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixroute.cli", "emulate", "--port", str(port),
         "--model", model, "--time-scale", "0.01"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    port = int(url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "emulated replica exited"
        with contextlib.suppress(OSError):
            if http(port, b"GET", b"/health", timeout=1.0).status == 200:
                return
        time.sleep(0.05)
    raise AssertionError(f"replica {url} did not start")


@dataclass
class Canary:
    port: int
    results: list[tuple[int | None, float]] = field(default_factory=list)  # (status, seconds)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        body = json.dumps({"model": "canary", "prompt": "hello canary", "max_tokens": 2}).encode()
        headers = [(b"x-tenant-id", b"canary"), (b"content-type", b"application/json")]
        while not self.stop.wait(0.02):
            started = time.monotonic()
            try:
                status = http(self.port, b"POST", b"/v1/completions", headers, body).status
            except (OSError, AssertionError):
                status = None
            self.results.append((status, time.monotonic() - started))


class Servers:
    """Gateways on a background loop; replicas as subprocesses; a canary thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gateways", daemon=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gateways: list[Gateway] = []

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        started = [_start_replica(m) for m in ("emulated", "emulated", "canary")]
        self.procs = [p for p, _ in started]
        urls = [u for _, u in started]
        for proc, url in started:
            _wait_healthy(url, proc)
        self.thread.start()
        base = GatewayConfig(
            port=0,
            replicas=tuple(urls),
            admin_token=TOKEN,
            health_interval_s=0.5,
            health_timeout_s=5.0,  # a loaded machine must not fail probes; request failures
            # still count (failure_threshold stays 3), so a poison request would still show
            read_timeout_s=10.0,
            client_header_timeout_s=HEADER_TIMEOUT_S,
            client_body_timeout_s=BODY_TIMEOUT_S,
        )
        fuzz = dataclasses.replace(
            base,
            tenancy=TenancyConfig(
                isolation=True,
                cache_salt_secret="fuzz-secret-0123456789",
                shareable_prefixes=("system: shared\n",),
                default_limits=TenantLimits(max_in_flight=64, requests_per_second=5000.0),
                max_tenants=64,
            ),
        )
        keyed = dataclasses.replace(
            base, tenancy=TenancyConfig(tenants=(TenantSpec("team", (hash_api_key(KEY),)),))
        )
        self.gateways = [Gateway(fuzz), Gateway(keyed)]
        for gw in self.gateways:
            self.call(gw.start())
        self.canary = Canary(self.port)
        self.canary_thread = threading.Thread(target=self.canary.run, name="canary", daemon=True)
        self.canary_thread.start()

    @property
    def port(self) -> int:
        return int(self.gateways[0].url.rsplit(":", 1)[1])

    @property
    def keyed_port(self) -> int:
        return int(self.gateways[1].url.rsplit(":", 1)[1])

    def stop(self) -> None:
        if hasattr(self, "canary"):
            self.canary.stop.set()
            self.canary_thread.join(10)
        for gw in self.gateways:
            self.call(gw.stop())
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    yield from running(Servers())


# --- a raw HTTP/1.1 client ----------------------------------------------------------------------
@dataclass
class Answer:
    status: int | None  # None: the server closed without answering
    headers: dict[str, str]
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    port: int,
    method: bytes,
    path: bytes,
    headers: list[tuple[bytes, bytes]] = (),  # type: ignore[assignment]
    body: bytes = b"",
    *,
    timeout: float = BOUND_S,
    content_length: bool = True,
) -> Answer:
    """One request on a fresh connection (``Connection: close``); read to EOF, within timeout."""
    started = time.monotonic()
    raw = exchange(
        port, method, path, list(headers), body, timeout=timeout, content_length=content_length
    )
    seconds = time.monotonic() - started
    status, parsed, rest = split_answer(raw)
    if status is not None and parsed.get("transfer-encoding") == "chunked":
        rest = _dechunk(rest)
    return Answer(status, parsed, rest, seconds)


def _dechunk(data: bytes) -> bytes:
    out = []
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(rest[:size])
        data = rest[size + 2 :]
    return b"".join(out)


def post_json(port: int, path: bytes, body: bytes, extra: list[tuple[bytes, bytes]] = ()) -> Answer:  # type: ignore[assignment]
    headers = [(b"content-type", b"application/json"), (b"x-tenant-id", b"fuzzer"), *extra]
    return http(port, b"POST", path, headers, body)


def assert_clear(answer: Answer, allowed: frozenset[int] | None = None) -> None:
    """A normal answer or a clear 4xx: an OpenAI-style JSON error naming what went wrong."""
    assert answer.status is not None, f"closed without an answer: {answer.body[:200]!r}"
    assert answer.status < 500, (answer.status, answer.body[:500])
    assert answer.seconds < BOUND_S
    if allowed is not None:
        assert answer.status in allowed, (answer.status, answer.body[:500])
    if answer.status >= 400 and answer.headers.get("content-type", "").startswith(
        "application/json"
    ):
        error = answer.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
    if answer.status < 400 or "json" in answer.headers.get("content-type", ""):
        assert answer.headers.get("x-request-id"), "every app answer carries a request id"


# --- strategies -------------------------------------------------------------------------------
ENDPOINTS = [b"/v1/completions", b"/v1/chat/completions", b"/v1/messages"]
texts = st.text(max_size=300)
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | texts
    | st.sampled_from(["emulated", "canary", "system: shared\n", ""])
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(texts, inner, max_size=6),
    max_leaves=40,
)
token_ids = st.lists(st.integers(min_value=-(2**40), max_value=2**40) | st.integers(0, 50000))
messages = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_calls"]) | texts,
        json_values | st.sampled_from(["user", "system", "assistant"]),
        max_size=4,
    )
    | json_values,
    max_size=5,
)
request_objects = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["emulated", "no-such-model", "canary"]) | json_values,
        "prompt": texts | token_ids | st.lists(texts, max_size=3) | st.lists(token_ids, max_size=2)
        | json_values,
        "messages": messages,
        "system": texts | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}),
                                   max_size=3) | json_values,
        "max_tokens": st.integers(-5, 40) | st.sampled_from([10**12, 2**63]) | json_values,
        "stream": st.booleans() | json_values,
        "cache_salt": texts | json_values,
        "n": st.sampled_from([1, 2, 0, None]),
        "stream_options": st.just({"include_usage": True}) | json_values,
    },
)  # fmt: skip


# --- the cases --------------------------------------------------------------------------------
@fuzz_settings(200)
@given(endpoint=st.sampled_from(ENDPOINTS), obj=request_objects)
def test_request_objects_with_wrong_types(
    servers: Servers, endpoint: bytes, obj: dict[str, Any]
) -> None:
    body = json.dumps(obj).encode()
    assert_clear(post_json(servers.port, endpoint, body))


@fuzz_settings(150)
@given(
    path=st.sampled_from([*ENDPOINTS, b"/v1/embeddings", b"/v1/models", b"/admin/tenants"]),
    body=st.binary(max_size=2000)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.tuples(st.sampled_from([b'{"prompt": "abc", "max_tokens": 2}', b'{"messages": []}']),
                st.integers(0, 40), st.binary(max_size=4))
      .map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1]:]),
)  # fmt: skip
def test_malformed_json_and_invalid_utf8(servers: Servers, path: bytes, body: bytes) -> None:
    assert_clear(post_json(servers.port, path, body))


header_names = st.sampled_from(
    [b"x-tenant-id", b"x-request-id", b"authorization", b"content-type", b"accept-encoding",
     b"x-custom", b"expect", b"connection", b"te", b"cookie"]
) | st.from_regex(rb"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}\Z")  # fmt: skip
header_values = st.binary(max_size=200).filter(
    lambda v: b"\r" not in v and b"\n" not in v and b"\x00" not in v
) | st.sampled_from([b"", b"Bearer " + KEY.encode(), b"Bearer x", b"\xff\xfe", b"100-continue",
                     b"gzip", b"a" * 9000, "é".encode(), b"team-\xc3"])  # fmt: skip


@fuzz_settings(150)
@given(
    keyed=st.booleans(),
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
)
def test_hostile_headers(servers: Servers, keyed: bool, headers: list[tuple[bytes, bytes]]) -> None:
    port = servers.keyed_port if keyed else servers.port
    body = b'{"prompt": "hello", "max_tokens": 2}'
    answer = http(port, b"POST", b"/v1/completions", headers, body)
    if answer.status == 400 and "json" not in answer.headers.get("content-type", ""):
        return  # refused by HTTP parsing itself (a bad header line): clear, and fine
    assert_clear(answer)
    if keyed and answer.status == 200:
        assert (b"authorization", b"Bearer " + KEY.encode()) in [(k.lower(), v) for k, v in headers]


@fuzz_settings(20)
@given(depth=st.integers(1, 200_000), kind=st.sampled_from(["[", "{", "prompt", "content"]))
def test_deeply_nested_bodies(servers: Servers, depth: int, kind: str) -> None:
    if kind == "[":
        body = b"[" * depth + b"]" * depth
    elif kind == "{":
        body = b'{"a":' * depth + b"1" + b"}" * depth
    elif kind == "prompt":
        body = b'{"prompt":' + b"[" * depth + b"1" + b"]" * depth + b"}"
    else:
        inner = b"[" * depth + b"]" * depth
        body = b'{"messages":[{"role":"user","content":' + inner + b"}]}"
    for endpoint in ENDPOINTS:
        assert_clear(post_json(servers.port, endpoint, body))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover - not Linux


def test_huge_prompts_and_bodies(servers: Servers) -> None:
    """Prompts of millions of characters (under the 8 MiB limit) get an answer; bodies over the
    limit get a 413, with or without a length up front; memory does not grow per request."""
    sizes = [1_000_000, 3_000_000, 7_000_000]
    answers = []
    rss: list[float] = []
    for round_ in range(3):
        for n in sizes:
            for endpoint in ENDPOINTS:
                text = "x" * n if round_ % 2 else ("lorem ipsum " * (n // 12 + 1))[:n]
                obj: dict[str, Any] = {"model": "emulated", "max_tokens": 1}
                if endpoint == ENDPOINTS[0]:
                    obj["prompt"] = text
                else:
                    obj["messages"] = [{"role": "user", "content": text}]
                answers.append(post_json(servers.port, endpoint, json.dumps(obj).encode()))
        rss.append(_rss_mb())
    for answer in answers:
        assert_clear(answer, frozenset({200, 400}))
    assert rss[2] - rss[0] < 100, f"RSS grew from {rss[0]:.0f} to {rss[2]:.0f} MB"
    over = b'{"prompt": "' + b"y" * (9 * 1024 * 1024) + b'"}'
    assert_clear(post_json(servers.port, ENDPOINTS[0], over), frozenset({413}))
    chunked = http(
        servers.port,
        b"POST",
        ENDPOINTS[0],
        [(b"transfer-encoding", b"chunked"), (b"x-tenant-id", b"fuzzer")],
        b"".join(hex(len(c))[2:].encode() + b"\r\n" + c + b"\r\n" for c in [over[: 2**22]] * 3)
        + b"0\r\n\r\n",
        content_length=False,
    )
    assert_clear(chunked, frozenset({413}))


@fuzz_settings(40)
@given(model=st.text(min_size=1, max_size=100).filter(lambda m: m not in ("emulated", "canary")))
def test_unknown_models_are_404(servers: Servers, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "hi"}).encode()
    answer = post_json(servers.port, ENDPOINTS[0], body)
    assert_clear(answer, frozenset({404}))
    assert answer.json()["error"]["code"] == "model_not_found"


def _slow_socket(port: int, first: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(first)
    s.setblocking(False)
    return s


def _poll(s: socket.socket) -> bytes | None:
    """None while the server keeps the connection open and silent; else what it sent first
    (b"" when it closed without a word)."""
    try:
        return s.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def test_slowloris_is_cut_off_and_others_are_served(servers: Servers) -> None:
    """Clients that send headers a byte at a time, or a body too slowly, are dropped after the
    timeouts; meanwhile ordinary requests are answered as usual."""
    port = servers.port
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    slow_headers = [_slow_socket(port, head[:5]) for _ in range(30)]
    slow_bodies = [
        _slow_socket(port, head + b"x-tenant-id: slow\r\nContent-Length: 1000\r\n\r\n{")
        for _ in range(10)
    ]
    idle = [_slow_socket(port, b"") for _ in range(10)]  # connect, then say nothing
    started = time.monotonic()
    open_ = slow_headers + slow_bodies + idle
    closed_at: dict[int, float] = {}
    first_words: dict[int, bytes] = {}
    ok = 0
    while open_ and time.monotonic() - started < HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 5:
        for s in list(open_):
            if s not in idle:
                with contextlib.suppress(OSError):
                    s.send(b"X" if s in slow_headers else b" ")  # one more byte, never the end
            got = _poll(s)
            if got is not None:
                closed_at[id(s)] = time.monotonic() - started
                first_words[id(s)] = got
                open_.remove(s)
        body = b'{"model": "canary", "prompt": "ordinary", "max_tokens": 1}'
        answer = post_json(port, ENDPOINTS[0], body)
        assert answer.status == 200 and answer.seconds < CANARY_BOUND_S
        ok += 1
        time.sleep(0.1)
    for s in slow_headers + slow_bodies + idle:
        s.close()
    assert not open_, f"{len(open_)} slow connections were never closed"
    for s in slow_bodies:  # a slow body is told why: a JSON 408
        assert first_words[id(s)].startswith(b"HTTP/1.1 408"), first_words[id(s)][:100]
        assert b'"code":"request_timeout"' in first_words[id(s)]
    assert max(closed_at.values()) < HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 2
    assert ok >= 5


def test_z_other_clients_were_unaffected_and_nothing_leaked(servers: Servers) -> None:
    """Runs last (by name): the canary's record over the whole module, and the books."""
    results = list(servers.canary.results)
    assert len(results) > 20
    failed = [r for r in results if r[0] != 200]
    assert not failed, failed[:5]
    slowest = max(s for _, s in results)
    print(f"canary: {len(results)} requests, all 200, slowest {slowest:.3f} s")  # for -s runs
    assert slowest < CANARY_BOUND_S

    async def books() -> list[tuple[int, int, int, int]]:
        await asyncio.sleep(0.2)  # let the last handlers finish
        out = []
        for gw in servers.gateways:
            state, tenants = gw.app[STATE], gw.app[TENANTS]
            in_flight = sum(gw.router.loads.get(r).in_flight for r in gw.router.replicas)
            busy = sum(tenants.describe(n, 0.0)["in_flight"] for n in tenants.names())
            out.append((state.limits.in_flight, in_flight, busy, tenants.live_count()))
        return out

    servers.canary.stop.set()
    servers.canary_thread.join(10)
    for gateway_in_flight, router_in_flight, tenant_in_flight, live in servers.call(books()):
        assert (gateway_in_flight, router_in_flight, tenant_in_flight) == (0, 0, 0)
        assert live <= 64 + 1
