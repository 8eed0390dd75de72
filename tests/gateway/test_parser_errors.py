"""What aiohttp answers below our middleware, and what client garbage costs the logs.

Requests its HTTP parser rejects get an OpenAI-style JSON 4xx that never repeats the client's
bytes (or the connection is closed), never aiohttp's plain text. A client sending garbage
produces DEBUG lines at most, never a traceback; our own bugs log a traceback at most once per
``TRACEBACK_EVERY_S`` per place.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prefixroute._serving import listen
from prefixroute._tracebacks import TracebackLimiter
from prefixroute.gateway._errors import make_error_middleware

from .helpers import ClusterFactory, GatewayFactory

# name -> bytes sent; each must end in a JSON 4xx or a closed connection.
GARBAGE: dict[str, bytes] = {
    "too_many_headers": b"GET /health HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: SECRET%d\r\n" % (i, i) for i in range(300))
    + b"\r\n",
    "huge_url": b"GET /SECRET" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header_line_too_long": b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: SECRET"
    + b"b" * 20_000
    + b"\r\n\r\n",
    "content_length_and_chunked": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two_content_lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nSECRET",
    "invalid_chunk_size": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nSECRETzz\r\nabc\r\n0\r\n\r\n",
    "bad_method": b"G@SECRET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "tls_hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03SECRET\r\n\r\n",
    "http09": b"GET /SECRET\r\n\r\n",
    "binary": b"\x00\xffSECRET\r\n\r\n",
    "bad_header_name": b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: SECRET\r\n\r\n",
    "bad_version": b"GET /health HTTP/9.SECRET\r\nHost: x\r\n\r\n",
}


async def _exchange(port: int, data: bytes, *, pause: bytes = b"") -> bytes:
    """Send ``data`` (then, after a moment, ``pause``) on a fresh connection; read to EOF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if pause:
            await asyncio.sleep(0.1)
            writer.write(pause)
        async with asyncio.timeout(10):
            return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


def _check(name: str, raw: bytes) -> tuple[int, dict[str, Any]] | None:
    """The status and JSON body of a JSON 4xx answer; None if the connection just closed."""
    if not raw:
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/"), (name, raw[:200])
    status = int(lines[0].split()[1])
    assert 400 <= status < 500, (name, raw[:300])
    content_type = next(
        v for k, _, v in (ln.partition(":") for ln in lines) if k.lower() == "content-type"
    )
    assert content_type.strip().startswith("application/json"), (name, raw[:300])
    obj = json.loads(body)
    assert set(obj["error"]) >= {"message", "type", "param", "code"}, (name, obj)
    assert b"SECRET" not in raw, (name, raw[:300])  # never reflects the client's bytes
    assert b"\r\nx-request-id: " in head.lower(), (name, head)
    return status, obj


async def test_parser_errors_are_json(make_gateway: GatewayFactory) -> None:
    gw = await make_gateway([])
    port = int(gw.url.rsplit(":", 1)[1])
    answers = {name: _check(name, await _exchange(port, data)) for name, data in GARBAGE.items()}
    statuses = {name: a[0] for name, a in answers.items() if a is not None}
    assert statuses["too_many_headers"] == 431
    assert statuses["huge_url"] == 414
    assert statuses["header_line_too_long"] == 431
    for name in ("content_length_and_chunked", "invalid_chunk_size", "bad_method", "tls_hello"):
        assert statuses[name] == 400, (name, answers[name])
        error = answers[name][1]["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error" and error["code"] == 400


async def test_bad_chunk_after_the_headers_is_json_400(make_gateway: GatewayFactory) -> None:
    """The body arrives after the handler started reading it: a 400 from the handler."""
    gw = await make_gateway([])
    port = int(gw.url.rsplit(":", 1)[1])
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    answer = _check(
        "late_bad_chunk", await _exchange(port, head, pause=b'5\r\n{"a":\r\nSECRET\r\n')
    )
    assert answer is not None and answer[0] == 400, answer


async def test_emulated_replica_answers_json_too(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(1)
    port = int(cluster.urls[0].rsplit(":", 1)[1])
    for name in ("too_many_headers", "content_length_and_chunked", "bad_method"):
        assert _check(name, await _exchange(port, GARBAGE[name])) is not None, name


async def test_garbage_floods_no_logs(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway([])
    port = int(gw.url.rsplit(":", 1)[1])
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    cases = list(GARBAGE.values()) + [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Length: 3\r\n\r\n{{{",  # bad JSON
        b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 404
    ]
    for start in range(0, 1000, 50):  # 1,000 requests, 50 at a time
        await asyncio.gather(
            *(_exchange(port, cases[i % len(cases)]) for i in range(start, start + 50))
        )
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(loud) <= 3, [r.getMessage() for r in loud]
    assert not any(r.exc_info for r in caplog.records)
    assert "Traceback" not in caplog.text


async def test_our_own_bug_logs_one_traceback_per_interval(
    caplog: pytest.LogCaptureFixture, session: aiohttp.ClientSession
) -> None:
    async def buggy(request: web.Request) -> web.Response:
        raise RuntimeError("a bug of ours")

    app = web.Application(middlewares=[make_error_middleware(1)])
    app.router.add_get("/", buggy)
    runner, url = await listen(app, "127.0.0.1", 0, shutdown_timeout_s=1)
    try:
        caplog.set_level(logging.DEBUG)
        caplog.clear()
        for _ in range(200):
            async with session.get(url) as resp:
                assert resp.status == 500
                assert (await resp.json())["error"]["message"] == "internal error"
    finally:
        await runner.cleanup()
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    assert caplog.text.count("Traceback") == 1


def test_traceback_limiter_counts_what_it_hides() -> None:
    now = [0.0]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test_traceback_limiter")
    logger.addHandler(Keep())
    logger.propagate = False
    limiter = TracebackLimiter(logger, every_s=10.0, clock=lambda: now[0])

    def fail(kind: type[Exception]) -> Exception:
        try:
            raise kind("x")
        except Exception as exc:
            return exc

    for _ in range(5):
        limiter.exception(fail(ValueError), "boom")  # one place, one type: logged once
    limiter.exception(fail(KeyError), "boom")  # another type: logged
    assert len(records) == 2
    now[0] = 10.0
    limiter.exception(fail(ValueError), "boom")
    assert len(records) == 3
    assert "4 more like it" in records[-1].getMessage()
    assert all(r.exc_info for r in records)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_body_that_does_not_decode_is_a_400_and_no_traceback(
    make_gateway: GatewayFactory, caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    """A Content-Encoding the body is not in: the client's mistake, so a JSON 400 and at most
    DEBUG lines. (aiohttp re-raised the decoding error while draining the body after the 400,
    and that was logged as an unhandled exception, a traceback per 10 s.)"""
    gw = await make_gateway([])
    port = int(gw.url.rsplit(":", 1)[1])
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    body = b'{"model": "SECRET", "prompt": "' + b"x" * 70_000 + b'"}'  # more than one read
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: %s\r\nContent-Length: %d\r\n\r\n" % (encoding.encode(), len(body))
    )
    for _ in range(3):
        raw = await _exchange(port, head + body)
        answer = _check("undecodable_body", raw[: raw.index(b"}}") + 2])
        assert answer is not None and answer[0] == 400, answer
    await asyncio.sleep(0.1)  # anything logged after the answer was sent
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
