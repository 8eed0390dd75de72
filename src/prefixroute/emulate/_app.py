"""The emulated replica's aiohttp application: OpenAI endpoints over one engine loop.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (plain or SSE stream),
``POST /v1/responses`` and ``GET /v1/responses/{id}`` (``_responses``: OpenAI's Responses API,
stored answers included), Anthropic's ``POST /v1/messages`` (``_messages``, as vLLM serves it),
SGLang's ``POST /generate`` (``_sglang``: its own request and answer shapes), ``GET /v1/models``,
``GET /health`` (200 while the engine runs, 503 otherwise), ``GET /metrics`` (Prometheus text,
vLLM metric names), ``POST /tokenize`` (vLLM's: a ``prompt`` or chat ``messages`` counted),
``POST /reset_prefix_cache`` (vLLM's dev-mode endpoint: drops every cached prefix unless
requests are running) and SGLang's ``GET /get_server_info`` (the few fields of it
that say the engine's size: its batch size, as ``max_running_requests`` and one data-parallel
rank's ``effective_max_running_requests_per_dp``, its KV cache and its context window).

With ``kv_events`` set, the replica publishes its KV-cache changes after every step on a ZMQ
socket, in vLLM's wire format (``_kv_events``), and a reset publishes ``AllBlocksCleared``.

A request holds its place in the engine only while its handler runs: ``finally`` releases it,
so a client that disconnects (the server runs with ``handler_cancellation``) frees its KV blocks
at once, as vLLM aborts a request whose client went away.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from prefixroute.emulate._config import EmulatorConfig
from prefixroute.emulate._engine import ABORTED, FINISHED, EngineLoop, EngineStopped, Generation
from prefixroute.emulate._errors import InvalidRequest, error_middleware
from prefixroute.emulate._kv_events import KVEventBridge
from prefixroute.emulate._messages import MessagesWriter, parse_messages
from prefixroute.emulate._metrics import make_registry
from prefixroute.emulate._openai import (
    Endpoint,
    ResponseWriter,
    check_window,
    error_event,
    models_body,
    parse_request,
    tokenize_answer,
)
from prefixroute.emulate._responses import ResponseStore, ResponsesWriter, parse_responses
from prefixroute.emulate._sglang import GenerateWriter, parse_generate
from prefixroute.events import EventPublisher
from prefixroute.sim.replica import ReplicaModel

CONFIG = web.AppKey("prefixroute.emulate.config", EmulatorConfig)
ENGINE = web.AppKey("prefixroute.emulate.engine", EngineLoop)
METRICS = web.AppKey("prefixroute.emulate.metrics", CollectorRegistry)
STARTED = web.AppKey("prefixroute.emulate.started", int)  # unix time, for /v1/models
EVENTS = web.AppKey("prefixroute.emulate.kv_events", KVEventBridge)  # only with kv_events
STORE = web.AppKey("prefixroute.emulate.responses", ResponseStore)  # the Responses API's

# One request's answer, by endpoint.
Writer = ResponseWriter | GenerateWriter | ResponsesWriter | MessagesWriter
MAX_BODY_BYTES = 64 * 1024 * 1024  # prompts of a few million characters still fit
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def build_app(config: EmulatorConfig) -> web.Application:
    """An application serving one emulated replica; its engine starts and stops with the app."""
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    endpoint = config.kv_events_endpoint
    model = ReplicaModel(config.engine, config.hash_seed, record_events=endpoint is not None)
    engine = EngineLoop(model, config.time_scale, speed_changes=config.speed_changes)
    if endpoint is not None:
        publisher = EventPublisher(endpoint, positional=config.kv_events_positional)
        bridge = app[EVENTS] = KVEventBridge(model, publisher, config.adapters)
        engine.after_step = bridge.flush
    app[CONFIG] = config
    app[ENGINE] = engine
    app[METRICS] = make_registry(engine, config.model)
    app[STORE] = ResponseStore()
    app[STARTED] = int(time.time())
    app.cleanup_ctx.append(_events_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/generate", sglang_generate)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/v1/responses/{response_id}", stored_response)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_post("/tokenize", tokenize_prompt)
    return app


async def _events_ctx(app: web.Application) -> AsyncIterator[None]:
    bridge = app.get(EVENTS)
    if bridge is None:
        yield
        return
    await bridge.publisher.start()
    try:
        yield
    finally:
        await bridge.publisher.stop()


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    engine = app[ENGINE]
    engine.start()
    yield
    await engine.stop()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Endpoint.COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Endpoint.CHAT)


async def _read_json(request: web.Request) -> object:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nested too deep: a 400
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc


async def sglang_generate(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Endpoint.GENERATE)


async def responses(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Endpoint.RESPONSES)


async def messages(request: web.Request) -> web.StreamResponse:
    return await _generate(request, Endpoint.MESSAGES)


async def stored_response(request: web.Request) -> web.Response:
    """A stored Responses answer (404 when this replica holds none by that id)."""
    answer = request.app[STORE].answer(request.match_info["response_id"])
    return web.json_response(answer)


async def _generate(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    config, engine = request.app[CONFIG], request.app[ENGINE]
    body = await _read_json(request)
    writer: Writer
    if endpoint is Endpoint.GENERATE:
        parsed = parse_generate(body, config.adapters)
        writer = GenerateWriter(parsed)
    elif endpoint is Endpoint.RESPONSES:
        store = request.app[STORE]
        parsed, conversation = parse_responses(body, config.model, config.adapters, store)
        writer = ResponsesWriter(parsed, config.model, conversation, store)
    elif endpoint is Endpoint.MESSAGES:
        parsed = parse_messages(body, config.model, config.adapters)
        writer = MessagesWriter(parsed, config.model, config.engine.block_size)
    else:
        parsed = parse_request(endpoint, body, config.model, config.adapters)
        writer = ResponseWriter(parsed, config.model)
    check_window(len(parsed.tokens), config.window, endpoint)
    overhead_s = config.engine.first_token_overhead_s * config.time_scale
    if overhead_s > 0:  # what a real server spends before its engine queues the request
        await asyncio.sleep(overhead_s)
    gen = engine.submit(parsed.tokens, parsed.max_tokens, parsed.cache_salt, parsed.adapter)
    try:
        if parsed.stream:
            usage = config.force_usage or parsed.include_usage
            return await _stream(request, writer, gen, usage)
        return await _whole(writer, gen)
    finally:
        engine.release(gen)


async def _whole(writer: Writer, gen: Generation) -> web.Response:
    generated = 0
    while (item := await gen.queue.get()) != FINISHED:
        if item == ABORTED:
            raise EngineStopped("the engine stopped before the request finished")
        generated = item
    body = writer.body(generated, gen.cached_tokens)
    return web.Response(body=body, content_type="application/json")


async def _stream(
    request: web.Request, writer: Writer, gen: Generation, usage: bool
) -> web.StreamResponse:
    """Token events as the engine makes them, then the usage chunk (when ``usage``) and
    ``[DONE]``."""
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    sent = 0
    end: int | None = None
    while end is None:
        # Everything the engine produced since the last write goes out in one write.
        items = [await gen.queue.get()]
        while not gen.queue.empty():
            items.append(gen.queue.get_nowait())
        generated = max(items)
        end = next((i for i in items if i < 0), None)
        out = writer.events(sent, generated, gen.cached_tokens) if generated > sent else b""
        sent = max(sent, generated)
        if end == FINISHED:
            out += writer.end(sent, gen.cached_tokens, usage)
        elif end == ABORTED:
            out += error_event("the engine stopped", "ServiceUnavailableError", 503)
        await resp.write(out)
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    started = request.app[STARTED]
    body = json.dumps(models_body(config.model, config.window, started, config.adapters))
    return web.Response(text=body, content_type="application/json")


async def tokenize_prompt(request: web.Request) -> web.Response:
    """vLLM's ``/tokenize`` (SGLang's takes the same ``prompt``): the prompt's token ids."""
    config = request.app[CONFIG]
    body = await _read_json(request)
    return web.json_response(tokenize_answer(body, config.model, config.window, config.adapters))


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Drop every cached prefix; ``{"success": false}`` while requests are running."""
    ok = request.app[ENGINE].model.reset_prefix_cache()
    bridge = request.app.get(EVENTS)
    if ok and bridge is not None:
        bridge.cleared()
    return web.json_response({"success": ok})


async def server_info(request: web.Request) -> web.Response:
    """SGLang's ``/get_server_info``, the fields that size the engine (SGLang's names)."""
    config = request.app[CONFIG]
    engine = config.engine
    body = {
        "model_path": config.model,
        "max_running_requests": engine.max_running,
        "max_total_num_tokens": engine.kv_capacity_blocks * engine.block_size,
        "context_length": config.window,
        "dp_size": 1,
        "internal_states": [{"effective_max_running_requests_per_dp": engine.max_running}],
    }
    return web.json_response(body)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[ENGINE].running else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
