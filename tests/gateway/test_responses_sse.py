"""A Responses API stream, as vLLM 0.32 writes it, seen by the relay's scanner: its first token
is its first ``*.delta`` event (not ``response.created``), its id comes from
``response.created``, its usage from ``response.completed``, and its error events are errors."""

from __future__ import annotations

import json

from prefixroute.gateway._sse import SSEScanner
from prefixroute.gateway._usage import answer_in_body, usage_in_body, usage_of


def event(kind: str, **fields: object) -> bytes:
    data = {**fields, "type": kind, "sequence_number": 0}
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


OPENING = {"id": "resp_abc", "object": "response", "status": "in_progress", "usage": None,
           "output": []}  # fmt: skip
USAGE = {"input_tokens": 34, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 3,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 37}  # fmt: skip
HEAD = (
    event("response.created", response=OPENING)
    + event("response.in_progress", response=OPENING)
    + event("response.output_item.added", item={"id": "msg_1", "content": []}, output_index=0)
    + event("response.content_part.added", part={"type": "output_text", "text": ""})
)
DELTA = event("response.output_text.delta", delta="Your", item_id="msg_1")
TAIL = event("response.output_text.done", text="Your") + event(
    "response.completed", response={**OPENING, "status": "completed", "usage": USAGE}
)


def test_the_opening_events_are_not_the_first_token_and_name_the_response() -> None:
    s = SSEScanner(responses=True)
    assert s.feed(HEAD) == HEAD
    assert not s.saw_data  # created, in progress, an item and a part added: nothing generated
    assert s.response_id == "resp_abc"
    s.feed(DELTA)
    assert s.saw_data


def test_a_function_calls_arguments_are_output_too() -> None:
    s = SSEScanner(responses=True)
    s.feed(HEAD + event("response.function_call_arguments.delta", delta='{"a"'))
    assert s.saw_data


def test_the_usage_is_read_from_response_completed() -> None:
    s = SSEScanner(responses=True)
    for chunk in (HEAD, DELTA, TAIL):
        s.feed(chunk)
    assert s.usage is not None
    assert (s.usage.prompt_tokens, s.usage.completion_tokens, s.cached_tokens) == (34, 3, 32)
    assert s.error_status is None


def test_error_and_failed_events_are_errors_not_output() -> None:
    s = SSEScanner(responses=True)
    s.feed(HEAD + event("error", code="server_error", message="boom"))
    assert (s.saw_data, s.error_status) == (False, 500)
    failed = SSEScanner(responses=True)
    failed.feed(HEAD + event("response.failed", response={**OPENING, "status": "failed"}))
    assert (failed.saw_data, failed.error_status) == (False, 500)
    coded = SSEScanner(responses=True)
    coded.feed(event("error", code=429, message="slow down"))
    assert coded.error_status == 429


def test_a_stream_not_of_the_responses_api_is_not_searched_for_one() -> None:
    s = SSEScanner()
    s.feed(HEAD + event("response.failed", response={**OPENING, "status": "failed"}))
    assert (s.response_id, s.error_status) == (None, None)


def test_a_whole_answers_usage_and_id() -> None:
    body = json.dumps({"id": "resp_9", "object": "response", "usage": USAGE}).encode()
    usage = usage_in_body(body)
    assert usage is not None and (usage.prompt_tokens, usage.cached_tokens) == (34, 32)
    assert answer_in_body(body) == (usage, "resp_9")  # one parse for both
    # Only a response object names a stored response; chat completions have ids too.
    chat = b'{"id": "chatcmpl-1", "object": "chat.completion", "usage": {"prompt_tokens": 3}}'
    assert answer_in_body(chat)[1] is None
    assert answer_in_body(b"not json") == (None, None)
    assert usage_of({"usage": {"input_tokens": "x", "output_tokens": 2}}) is not None
    assert usage_of({"response": {"usage": None}}) is None
