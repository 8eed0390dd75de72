from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from prefixroute.gateway._sse import SSEScanner
from prefixroute.gateway._usage import cached_tokens_in_body, cached_tokens_of

USAGE = {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 7}}
STREAM = (
    b'data: {"choices":[{"text":" a"}]}\n\n'
    b'data: {"choices":[{"text":" b"}]}\n\n'
    + b"data: "
    + json.dumps({"choices": [], "usage": USAGE}).encode()
    + b"\n\ndata: [DONE]\n\n"
)


def test_whole_events_pass_at_once() -> None:
    s = SSEScanner()
    assert s.feed(STREAM) == STREAM
    assert s.saw_data and s.cached_tokens == 7 and s.pending == 0


def test_partial_event_waits_for_its_end() -> None:
    s = SSEScanner()
    assert s.feed(b'data: {"a"') == b""
    assert not s.saw_data
    assert s.feed(b":1}\n\ndata: {") == b'data: {"a":1}\n\n'
    assert s.saw_data and s.pending == len(b"data: {")


def test_crlf_boundaries() -> None:
    s = SSEScanner()
    assert s.feed(b"data: x\r\n\r\ndata: y\r\n") == b"data: x\r\n\r\n"
    assert s.flush() == b"data: y\r\n"


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=8, unique=True))
def test_any_split_relays_the_same_bytes(cuts: list[int]) -> None:
    s = SSEScanner()
    bounds = [0, *sorted(cuts), len(STREAM)]
    out = b"".join(s.feed(STREAM[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    assert out + s.flush() == STREAM
    assert s.cached_tokens == 7


def test_usage_extraction() -> None:
    assert cached_tokens_of({"usage": USAGE}) == 7
    assert cached_tokens_of({"usage": {"prompt_tokens": 3}}) is None
    assert cached_tokens_of({"usage": {"prompt_tokens_details": None}}) is None
    assert cached_tokens_of({"usage": {"prompt_tokens_details": {"cached_tokens": True}}}) is None
    assert cached_tokens_of([1]) is None
    assert cached_tokens_in_body(json.dumps({"usage": USAGE}).encode()) == 7
    assert cached_tokens_in_body(b'{"usage": oops') is None
    assert cached_tokens_in_body(b"{}") is None
