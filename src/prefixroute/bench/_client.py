"""One completion, timed: streamed (first token, gaps between tokens, end and the usage block) or
plain (its end and usage only: a plain answer shows no first token). OpenAI's answers and
Anthropic's Messages answers are read alike: a Messages stream's content is its
``content_block_delta`` events, and its usage (in ``message_start`` and ``message_delta``, or a
whole message's) is Anthropic's split, the prompt being all three of its input counts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prefixroute._pool import send
from prefixroute._usage_counts import Usage, merged, usage_of

_JSON = {"Content-Type": "application/json"}
PREDICTED_HEADER = "x-prefixroute-predicted-cached-tokens"  # the gateway's (gateway._proxy)


@dataclass(slots=True)
class Outcome:
    """What one request saw, in wall-clock seconds from when it was sent."""

    status: int = 0  # HTTP status (0: no response)
    ttft_s: float | None = None  # first token
    e2e_s: float | None = None  # last byte
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None  # from usage
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None = None
    replica: str = ""  # x-prefixroute-replica, when a gateway answered
    reason: str = ""  # x-prefixroute-reason
    # x-prefixroute-predicted-cached-tokens: the router's prediction (None: no such header,
    # e.g. a replica asked directly)
    predicted_cached_tokens: int | None = None
    error: str | None = None  # set when the request failed
    plain: bool = False  # asked without a stream: no first token to time

    @property
    def ok(self) -> bool:
        seen = self.ttft_s is not None or (self.plain and self.e2e_s is not None)
        return self.error is None and self.status == 200 and seen


async def stream_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> Outcome:
    """POST ``body`` (with ``stream`` on) to ``url`` and time the SSE stream it returns."""
    return await _completion(session, url, body, Outcome())


async def plain_completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> Outcome:
    """POST ``body`` (with no stream) to ``url`` and time its answer, read whole."""
    return await _completion(session, url, body, Outcome(plain=True))


async def _completion(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], out: Outcome
) -> Outcome:
    """One request, answered into ``out``: its stream read as it comes, or (``out.plain``) its
    answer read whole."""
    t0 = time.perf_counter()
    try:
        data = json.dumps(body).encode()
        async with await send(session, "POST", url, lambda: data, _nothing, headers=_JSON) as resp:
            _answered(out, resp)
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            await (_read_whole(out, resp) if out.plain else _read_stream(out, resp, t0))
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.e2e_s = time.perf_counter() - t0
    return out


async def _read_stream(out: Outcome, resp: aiohttp.ClientResponse, t0: float) -> None:
    """The SSE events: the first content's time, the gaps after it, errors and usage."""
    last = t0
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            out.error = str(chunk["error"].get("message", chunk["error"]))
            break
        now = time.perf_counter()
        if _has_content(chunk):
            if out.ttft_s is None:
                out.ttft_s = now - t0
            else:
                out.itl_s.append(now - last)
            last = now
        _usage(out, chunk)


async def _read_whole(out: Outcome, resp: aiohttp.ClientResponse) -> None:
    """A plain answer: an error in its body, or its usage."""
    answer = json.loads(await resp.read())
    if not isinstance(answer, dict) or "error" in answer:
        error = answer.get("error") if isinstance(answer, dict) else answer
        out.error = f"not an answer: {str(error)[:200]}"
        return
    _usage(out, answer)


def _answered(out: Outcome, resp: aiohttp.ClientResponse) -> None:
    """The status and the gateway's headers (its choice, why, and its prediction)."""
    out.status = resp.status
    out.replica = resp.headers.get("x-prefixroute-replica", "")
    out.reason = resp.headers.get("x-prefixroute-reason", "")
    out.predicted_cached_tokens = _count(resp.headers.get(PREDICTED_HEADER))


def _usage(out: Outcome, answer: dict[str, Any]) -> None:
    """The usage an answer or a stream event reports, if any (the gateway's reader: OpenAI's,
    or Anthropic's split), over what earlier events reported."""
    usage = usage_of(answer)
    if usage is None:
        return
    earlier = Usage(out.prompt_tokens, out.completion_tokens, out.cached_tokens)
    usage = merged(usage, earlier)
    out.prompt_tokens, out.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    out.cached_tokens = usage.cached_tokens


def _nothing() -> None:
    """No count of resends here: the load generator reports the server's errors only."""


def _count(value: str | None) -> int | None:
    """A header's token count; None when it is absent or no count."""
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n >= 0 else None


def _has_content(chunk: dict[str, Any]) -> bool:
    if chunk.get("type") == "content_block_delta":  # Anthropic's
        return True
    for choice in chunk.get("choices") or ():
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False
