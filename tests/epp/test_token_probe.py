"""The picker, like ``serve``, asks a replica's ``/tokenize`` for a model's characters per token
before any answer has told them (``gateway/_token_probe.py``): its first picks are costed in
the engine's tokens, not at the 4-characters prior."""

from __future__ import annotations

import json

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from prefixroute.emulate import count_tokens

from .conftest import PickerFactory
from .support import request_body, request_headers

PROMPT = " ".join(f"w{i:07d}" for i in range(500))  # about 9 characters a token


async def test_the_pickers_first_pick_is_costed_at_the_replicas_count(
    make_picker: PickerFactory,
) -> None:
    epp = await make_picker()
    body = {"model": "emulated", "prompt": PROMPT, "max_tokens": 4}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await call.write(request_headers())
        await call.write(request_body(json.dumps(body).encode()))
        answer = await call.read()
        call.cancel()
    assert answer is not grpc.aio.EOF
    assert epp.router.usage_reports == 0  # nothing was answered: the count came from /tokenize
    true = len(PROMPT) / count_tokens(PROMPT)
    learned = epp.router.chars_per_token_of("emulated")
    assert abs(learned / true - 1) < 0.02, (learned, true)
