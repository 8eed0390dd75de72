from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixroute.gateway._sse import SSEScanner
from prefixroute.gateway._usage import (
    ask_for_stream_usage,
    cached_tokens_in_body,
    cached_tokens_of,
)

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


# -- usage the gateway asked for (stream_usage): read, and kept from the client ------------------

USAGE_EVENT = b"data: " + json.dumps({"choices": [], "usage": USAGE}).encode() + b"\n\n"
TOKENS = b'data: {"choices":[{"text":" a"}]}\n\ndata: {"choices":[{"text":" b"}]}\n\n'


def test_a_hidden_usage_event_is_read_and_not_relayed() -> None:
    s = SSEScanner(hide_usage=True)
    assert s.feed(STREAM) == TOKENS + b"data: [DONE]\n\n"
    assert s.cached_tokens == 7 and s.usage is not None and s.usage.prompt_tokens == 9


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=8, unique=True))
def test_any_split_hides_the_usage_event_alone(cuts: list[int]) -> None:
    s = SSEScanner(hide_usage=True)
    bounds = [0, *sorted(cuts), len(STREAM)]
    out = b"".join(s.feed(STREAM[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    assert out + s.flush() == TOKENS + b"data: [DONE]\n\n"
    assert s.cached_tokens == 7


def test_events_that_only_mention_usage_are_relayed() -> None:
    # SGLang writes "usage": null in every chunk; a chunk with choices and usage (continuous
    # usage stats) is the client's too. Only choices == [] with a usage object is ours.
    sglang = b'data: {"choices":[{"delta":{"content":"x"}}],"usage":null}\n\n'
    continuous = b'data: {"choices":[{"text":"y"}],"usage":' + json.dumps(USAGE).encode() + b"}\n\n"
    empty = b'data: {"choices":[],"usage":null}\n\n'
    s = SSEScanner(hide_usage=True)
    assert s.feed(sglang + continuous + empty) == sglang + continuous + empty
    assert s.usage is None


def test_crlf_and_multi_line_usage_events_are_hidden() -> None:
    body = json.dumps({"choices": [], "usage": USAGE}, indent=1).encode().splitlines()
    multi = b"".join(b"data: " + line + b"\r\n" for line in body) + b"\r\n"  # one event
    s = SSEScanner(hide_usage=True)
    assert s.feed(b"data: x\r\n\r\n" + multi + b"data: [DONE]\r\n\r\n") == (
        b"data: x\r\n\r\ndata: [DONE]\r\n\r\n"
    )
    assert s.cached_tokens == 7


def test_a_usage_event_left_unterminated_at_the_end_is_hidden() -> None:
    s = SSEScanner(hide_usage=True)
    assert s.feed(TOKENS + USAGE_EVENT[:-2]) == TOKENS
    assert s.flush() == b""
    assert s.cached_tokens == 7


def test_the_gateway_asks_for_usage_only_where_it_is_missing_and_allowed() -> None:
    asked: list[tuple[object, object]] = [
        ({"stream": True}, {"include_usage": True}),
        ({"stream": True, "stream_options": None}, {"include_usage": True}),
        ({"stream": True, "stream_options": {"include_usage": False}}, {"include_usage": True}),
        # Booleans as the engines' request models read them (pydantic's lax mode).
        ({"stream": 1}, {"include_usage": True}),
        ({"stream": "yes"}, {"include_usage": True}),
        ({"stream": True, "stream_options": {"include_usage": None}}, {"include_usage": True}),
        ({"stream": "true", "stream_options": {"include_usage": "False"}}, {"include_usage": True}),
        (
            {
                "stream": True,
                "stream_options": {"include_usage": 0, "continuous_usage_stats": "no"},
            },
            {"include_usage": True, "continuous_usage_stats": "no"},
        ),
    ]
    for body, options in asked:
        assert ask_for_stream_usage(body) is True
        assert body["stream_options"] == options  # type: ignore[index]
    left = [
        {"stream": False},
        {"prompt": "x"},  # no stream: a replica refuses stream_options there (vLLM)
        {"stream": 0},
        {"stream": "no"},
        {"stream": "maybe"},  # not a boolean: the replica refuses it
        {"stream": True, "stream_options": {"include_usage": True}},  # asked: the client's
        {"stream": True, "stream_options": {"include_usage": 1}},  # asked, as vLLM reads it
        {"stream": True, "stream_options": {"include_usage": "true"}},
        {"stream": True, "stream_options": {"include_usage": "perhaps"}},  # the replica's 400
        # the engine's call: include_usage defaults to true in SGLang's StreamOptions and to
        # false in vLLM 0.32's, so the client's expectation cannot be told
        {"stream": True, "stream_options": {}},
        {"stream": True, "stream_options": {"continuous_usage_stats": False}},
        {"stream": True, "stream_options": {"continuous_usage_stats": True}},
        {"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": 1}},
        {"stream": True, "stream_options": "x"},  # the replica's to refuse
        [1, 2],
    ]
    for body in left:
        before = json.dumps(body)
        assert ask_for_stream_usage(body) is False
        assert json.dumps(body) == before


ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'


def test_an_opening_chunk_with_only_the_role_is_not_the_first_token() -> None:
    # Servers that send it when the stream opens, before prefill, made every first token
    # they served read as instant.
    s = SSEScanner()
    assert s.feed(ROLE) == ROLE and not s.saw_data
    s.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    assert s.saw_data
    s = SSEScanner()  # the role and the first token in one event, as vLLM sends them
    s.feed(b'data: {"choices":[{"delta":{"role":"assistant","content":"Hi"}}]}\n\n')
    assert s.saw_data


def test_what_counts_as_output() -> None:
    def first(events: bytes) -> bool:
        s = SSEScanner()
        s.feed(events)
        return s.saw_data

    assert not first(b'data: {"choices":[{"text":""}]}\n\n')  # nothing generated yet
    assert not first(b'data: {"choices":[]}\n\ndata: [DONE]\n\n')
    assert first(b'data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}\n\n')
    assert first(b'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}\n\n')
    # An error reported in-band is no output (no first token to time), in either form.
    assert not first(b'data: {"error":{"message":"boom"}}\n\n')
    assert not first(b'data: {"object":"error","message":"boom","code":500}\n\n')
    assert first(b"data: not json\n\n")
    s = SSEScanner()  # at the end of the stream too
    s.feed(ROLE)
    s.feed(b'data: {"choices":[{"text":"x"}]}')
    assert not s.saw_data and s.flush() and s.saw_data


@pytest.mark.parametrize(
    ("event", "status"),
    [
        (b'data: {"error":{"message":"boom","code":500}}', 500),  # SGLang, newer vLLM
        (b'data: {"error":{"message":"too long","code":400}}', 400),
        (b'data: {"object":"error","message":"x","type":"BadRequestError","code":400}', 400),
        (b'data: {"error":{"message":"no code"}}', 500),  # none named: the server's
        (b'data: {"error":"a string"}', 500),
        (b'data: {"error":{"code":"503"}}', 503),
        (b'data: {"error":{"code":42}}', 500),  # not an HTTP status
        (b'data: {"choices":[{"text":"the word \\"error\\""}]}', None),  # output, not an error
        (b'data: {"choices":[],"error":{"code":500}}', None),  # a chunk is output's
    ],
)
def test_an_error_reported_in_band_is_noted_with_its_status(
    event: bytes, status: int | None
) -> None:
    s = SSEScanner()
    assert s.feed(event + b"\n\n") == event + b"\n\n"  # relayed as it came
    assert s.error_status == status
    s = SSEScanner()  # after output, and at the stream's end (flush), too
    s.feed(b'data: {"choices":[{"text":"a"}]}\n\n')
    s.feed(event)
    s.flush()
    assert s.saw_data and s.error_status == status


# --- SGLang's /generate stream: every chunk carries meta_info, text is all so far ---------------
def _native(text: str, done: int, cached: int = 40, prompt: int = 50) -> bytes:
    meta = {"prompt_tokens": prompt, "completion_tokens": done, "cached_tokens": cached}
    return b"data: " + json.dumps({"text": text, "meta_info": meta}).encode() + b"\n\n"


def test_a_generate_streams_counts_are_its_last_chunks() -> None:
    s = SSEScanner()
    stream = _native(" a", 1, cached=10) + _native(" a b", 2, cached=30) + b"data: [DONE]\n\n"
    assert s.feed(stream) == stream  # relayed as sent
    assert s.usage is not None
    assert (s.usage.prompt_tokens, s.usage.completion_tokens, s.cached_tokens) == (50, 2, 30)
    s = SSEScanner()  # one chunk at a time, the last held to the end of the stream
    s.feed(_native(" a", 1, cached=10))
    s.feed(_native(" a b", 2, cached=30)[:-2])
    assert s.flush() and s.cached_tokens == 30


def test_a_generate_chunk_is_output_once_a_token_is_made() -> None:
    def first(events: bytes) -> bool:
        s = SSEScanner()
        s.feed(events)
        return s.saw_data

    assert first(_native(" a", 1))
    assert first(_native("", 1))  # a token that ends inside a UTF-8 character: made, no text
    assert not first(_native("", 0))  # nothing made yet
    assert first(_native("", 0) + _native("x", 1))


_PIECES = st.lists(
    st.sampled_from([b"data: x", b"data: {}", b"\n", b"\r", b"\n\n", b"\r\n\r\n", b"\r\r", b":"]),
    max_size=30,
)


def _cut_by_searching_everything_held(held: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """The reference: what is passed on and what is held, searching all held bytes and the
    chunk for the last boundary (the scanner before it searched the new bytes only)."""
    data = held + chunk
    end = max((data.rfind(sep) + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r")
               if data.rfind(sep) >= 0), default=0)  # fmt: skip
    return data[:end], data[end:]


@given(_PIECES, st.lists(st.integers(min_value=1, max_value=200), max_size=20))
def test_many_small_chunks_are_cut_as_a_search_of_all_held_bytes_cuts_them(
    pieces: list[bytes], cuts: list[int]
) -> None:
    """A boundary may straddle two chunks (even three, one byte each): each chunk is searched
    only with the last bytes held before it (an event sent in many chunks was searched whole
    at every one, O(n^2) in its size: an outside audit, 2026-12-06), and must be cut where a
    search of everything held cuts it."""
    stream = b"".join(pieces)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    scanner, held = SSEScanner(), b""
    for a, b in zip(bounds, bounds[1:], strict=False):
        expected, held = _cut_by_searching_everything_held(held, stream[a:b])
        assert scanner.feed(stream[a:b]) == expected
        assert scanner.pending == len(held)
    assert scanner.flush() == held


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_a_boundary_cut_anywhere_is_found(sep: bytes) -> None:
    for k in range(1, len(sep)):  # two chunks, the boundary split after k bytes
        s = SSEScanner()
        assert s.feed(b"data: x" + sep[:k]) == b""
        assert s.feed(sep[k:] + b"data: y") == b"data: x" + sep
        assert s.pending == len(b"data: y")
    s = SSEScanner()  # one byte a chunk
    out = b"".join(s.feed(bytes([c])) for c in b"data: x" + sep)
    assert out == b"data: x" + sep and s.pending == 0
