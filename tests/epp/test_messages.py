"""Anthropic's Messages API through the picker: the same keying, usage reading and first-token
rule as the gateway's (core/messages_input.py, gateway/_sse.py), which the picker shares: a
conversation's next turn is picked where its prefix is, no ``stream_options`` is added to the
body, the first token is the first ``content_block_delta`` and the usage is Anthropic's
split."""

from __future__ import annotations

import json
from typing import Any

from prefixroute.epp import PickStream

from .support import pick, response_body, response_headers, shared


def body(turns: int, stream: bool = True) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant",
                 "content": [{"type": "text", "text": f"turn {i} " + "word " * 150}]}
                for i in range(turns)]  # fmt: skip
    messages[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}  # type: ignore[index]
    return json.dumps({"model": "m", "system": "You are terse. " * 50, "messages": messages,
                       "max_tokens": 4, "stream": stream}).encode()  # fmt: skip


def event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


async def test_a_conversation_is_picked_on_its_prefix_and_its_stream_teaches_the_router() -> None:
    s = shared("predicted_ttft")
    first = PickStream(s)
    out = await pick(first, body(1), "/v1/messages")
    assert first.decision is not None
    replica = first.decision.replica
    # The body goes on as the client sent it: no stream_options (not a Messages field).
    assert out[1].request_body.response.body_mutation.streamed_response.body == body(1)
    load = s.router.loads.get(replica)
    await first.handle(response_headers(content_type="text/event-stream"))
    opening = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
               "usage": {"input_tokens": 600, "output_tokens": 0}}  # fmt: skip
    block = {"type": "text", "text": ""}
    start = event("message_start", message=opening)
    await first.handle(response_body(start + event("content_block_start", content_block=block)))
    assert load.prefilling == 1  # the opening events are no first token
    delta = {"type": "text_delta", "text": "Hi"}
    await first.handle(response_body(event("content_block_delta", index=0, delta=delta)))
    assert load.prefilling == 0
    usage = {"input_tokens": 600, "cache_read_input_tokens": 0, "output_tokens": 4}
    await first.handle(response_body(event("message_delta", usage=usage,
                                           delta={"stop_reason": "max_tokens"})
                                     + event("message_stop"), end_of_stream=True))  # fmt: skip
    assert s.router.usage_reports == 1 and load.in_flight == 0

    second = PickStream(s)
    await pick(second, body(3), "/v1/messages")
    assert second.decision is not None and second.decision.replica == replica
    assert second.decision.predicted_cached_tokens > 0


async def test_a_bad_request_is_refused_before_any_pick() -> None:
    s = shared()
    stream = PickStream(s)
    out = await pick(stream, json.dumps({"model": "m", "messages": []}).encode(), "/v1/messages")
    assert stream.decision is None
    status = out[-1].immediate_response.status.code
    assert status == 400, out
    # In Anthropic's error shape, as its SDKs read it (gateway/_errors.py).
    answer = json.loads(out[-1].immediate_response.body)
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"]
