"""An Anthropic Messages stream and answer, as vLLM 0.32 writes them, seen by the relay's
scanner and the usage reader: the first token is the first ``content_block_delta`` (not
``message_start``), the usage is Anthropic's split (``input_tokens`` is the prompt less what was
read from the cache), and a closing ``message_delta`` that gives only the output tokens (as
Anthropic's own does) keeps the prompt's counts from ``message_start``."""

from __future__ import annotations

import json

from prefixroute.gateway._sse import SSEScanner
from prefixroute.gateway._usage import Usage, answer_in_body, usage_of


def event(kind: str, **fields: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


USAGE = {"input_tokens": 12, "cache_read_input_tokens": 96, "output_tokens": 3}
OPENING = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
           "stop_reason": None, "usage": {"input_tokens": 108, "output_tokens": 0}}  # fmt: skip
HEAD = (
    event("message_start", message=OPENING)
    + event("content_block_start", index=0, content_block={"type": "text", "text": ""})
    + event("ping")
)
DELTA = event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})
STOP = {"stop_reason": "max_tokens", "stop_sequence": None}


def test_the_opening_events_are_not_the_first_token_and_a_delta_is() -> None:
    s = SSEScanner()
    assert s.feed(HEAD) == HEAD  # relayed as it came
    assert not s.saw_data  # the message, an empty block and a ping: nothing generated yet
    s.feed(DELTA)
    assert s.saw_data


def test_the_closing_usage_is_read_as_prompt_cached_and_output() -> None:
    s = SSEScanner()
    s.feed(HEAD + DELTA)
    assert s.usage == Usage(108, 0, None)  # message_start: the prompt, nothing cached known
    s.feed(event("content_block_stop", index=0) + event("message_delta", delta=STOP, usage=USAGE)
           + event("message_stop"))  # fmt: skip
    assert s.usage == Usage(108, 3, 96) and s.cached_tokens == 96
    assert s.error_status is None


def test_a_closing_delta_with_only_output_tokens_keeps_the_prompts_counts() -> None:
    s = SSEScanner()
    start = {**OPENING, "usage": {"input_tokens": 8, "cache_read_input_tokens": 100,
                                  "output_tokens": 1}}  # fmt: skip
    s.feed(event("message_start", message=start) + DELTA)
    s.feed(event("message_delta", delta=STOP, usage={"output_tokens": 5}))
    assert s.usage == Usage(108, 5, 100)


def test_an_error_event_is_an_error_not_output() -> None:
    s = SSEScanner()
    s.feed(event("message_start", message=OPENING))
    s.feed(event("error", error={"type": "overloaded_error", "message": "Overloaded"}))
    assert s.error_status == 500 and not s.saw_data


def test_a_whole_answer_reads_anthropics_split() -> None:
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
              "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
              "usage": {**USAGE, "cache_creation_input_tokens": 4}}  # fmt: skip
    assert answer_in_body(json.dumps(answer).encode()) == (Usage(112, 3, 96), None)
    # Without cache fields (vLLM without prompt-token details), the prompt is input_tokens.
    plain = {**answer, "usage": {"input_tokens": 50, "output_tokens": 2}}
    assert usage_of(plain) == Usage(50, 2, None)
