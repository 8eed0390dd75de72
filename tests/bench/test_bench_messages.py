"""``bench --api messages``: each turn sent as an Anthropic Messages request (bench/_replay.py),
its text one user message, and its answer read as Anthropic's (bench/_client.py): the first
``content_block_delta`` is the first token, and the prompt is all three of the usage's input
counts, so a replay measures a fleet served through ``/v1/messages`` as it measures one served
through ``/v1/completions``."""

from __future__ import annotations

import aiohttp
import pytest

from prefixroute.bench import ReplayConfig, replay
from prefixroute.cli import main
from prefixroute.core import DEFAULT_POLICY
from prefixroute.emulate import EmulatorConfig, start_replicas
from prefixroute.gateway import Gateway, GatewayConfig
from prefixroute.gateway._state import STATE
from prefixroute.sim import summarize
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.workloads import make_workload

SCALE = 0.05  # wall seconds per workload second


async def _run(api: str, plain: float = 0.0) -> tuple[object, int]:
    workload = make_workload("multi-turn", 0, {"sessions": "8"})
    cluster = await start_replicas(2, EmulatorConfig(ReplicaConfig(), time_scale=SCALE))
    try:
        cfg = GatewayConfig(port=0, replicas=tuple(cluster.urls), policy=DEFAULT_POLICY)
        async with Gateway(cfg) as gw:
            replay_cfg = ReplayConfig(gw.url, "emulated", SCALE, api=api, plain=plain, seed=1)
            result = await replay(workload, replay_cfg, api)
            missing = sum(sample.value for metric in gw.app[STATE].metrics.registry.collect()
                          for sample in metric.samples
                          if sample.name == "prefixroute_usage_missing_total")  # fmt: skip
    finally:
        await cluster.stop()
    return result, int(missing)


async def test_a_replay_through_the_messages_api_measures_what_completions_do() -> None:
    messages, missing = await _run("messages", plain=0.25)
    assert messages.errors == [] and missing == 0  # type: ignore[attr-defined]
    recs = messages.run.records  # type: ignore[attr-defined]
    for rec in recs:
        assert rec.finish_s is not None and rec.replica  # answered, through the gateway
        assert (rec.first_token_s is None) == rec.plain  # the first content_block_delta
        assert rec.cached_reported  # Anthropic's cache_read_input_tokens
    assert any(r.plain for r in recs) and any(r.cached_tokens > 0 for r in recs)
    m = summarize(messages.run, None)  # type: ignore[attr-defined]
    assert m.completed == len(recs)
    # The prompt is the three counts together: the completion's prompt plus what the chat
    # template wraps one user message in (the emulator's "<|user|> ... <|end|> <|assistant|>"),
    # the same for every request.
    completions, _ = await _run("completions")
    ours = {r.request_id: r.prompt_tokens for r in recs}
    theirs = {r.request_id: r.prompt_tokens for r in completions.run.records}  # type: ignore[attr-defined]
    assert ours.keys() == theirs.keys()
    wrapped = {ours[k] - theirs[k] for k in ours}
    assert len(wrapped) == 1 and wrapped.pop() > 0


def test_messages_against_a_url_needs_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--api", "messages", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--model" in err, err


def test_an_unknown_api_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--api", "grpc", "-w", "seed-conversation"])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--api" in last and "'messages'" in last and "'completions'" in last


async def test_anthropics_own_stream_shape_keeps_the_prompt_from_message_start() -> None:
    """Anthropic's API (unlike vLLM's) gives the input counts only in ``message_start`` and the
    output alone in the closing ``message_delta``."""
    import json

    from aiohttp import web

    from prefixroute.bench import stream_completion

    def event(kind: str, **fields: object) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        usage = {"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 1}
        await resp.write(event("message_start", message={"type": "message", "usage": usage}))
        await resp.write(event("content_block_delta", index=0, delta={"text": "Hi"}))
        await resp.write(event("message_delta", delta={}, usage={"output_tokens": 3}))
        await resp.write(event("message_stop"))
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            out = await stream_completion(http, f"http://127.0.0.1:{port}/v1/messages", {})
    finally:
        await runner.cleanup()
    assert out.ok and out.ttft_s is not None
    assert (out.prompt_tokens, out.cached_tokens, out.completion_tokens) == (100, 90, 3)
