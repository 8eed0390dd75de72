#!/usr/bin/env python3
# ruff: noqa
# Kept as its author wrote it (benchmarks/foreign_fleet.py says who and why): the lint rules
# are ours, not its author's.
"""foreign_replica_c -- an emulated vLLM (v1 engine, OpenAI server) with no model and no GPU.

It sleeps for modelled compute time and emits deterministic filler tokens in real
time, so that from the outside it looks like a vLLM 0.8+/0.9 "V1" engine on a GPU.

Modelled behaviours
-------------------
Tokenizer / prompts
  * Text is split into words (\\w+) and punctuation marks; a word of <=4 chars is one
    token, a longer word ceil(len/4) tokens (4-char pieces), each punctuation mark
    one token. Token id = zlib.crc32(piece) % 50000.
  * Chat messages are rendered "<|im_start|>{role}\\n{content}<|im_end|>\\n" each, then
    "<|im_start|>assistant\\n". Content may be a string or a list of text parts.
  * Output is filler: each token is " " + a short (<=4 char) word chosen
    deterministically from the prompt, so the reply re-tokenizes to exactly the
    token ids that were generated (a later turn containing it gets prefix hits).
KV cache (vLLM v1 KVCacheManager / BlockPool)
  * num_blocks = kv_tokens // page_size; block 0 is the reserved null block.
  * Only FULL blocks are cached, keyed by a chained hash (parent_hash, block ids).
    Prompt and generated tokens both fill blocks; a block is cached once full.
  * Cache hit = longest run of leading full blocks present in the cache, capped at
    (num_tokens - 1) tokens, so a fully cached prompt recomputes its last block.
  * Ref-counted blocks; a free block keeps its hash until evicted. Freed requests'
    blocks go to the tail of the free queue in reverse order (tail blocks evicted
    first); allocation pops the head and evicts its hash. A cache hit on a free
    block removes it from the free queue.
Scheduler (vLLM v1, FCFS)
  * Per-step token budget = --chunk. Running requests first (decode = 1 token,
    unfinished prefill = min(remaining, budget): chunked prefill), then waiting
    requests FCFS while len(running) < --max-running and budget remains.
  * If a running request cannot get a block, the last running request is preempted
    (blocks freed, num_computed reset, pushed to the head of waiting, later recomputed
    over prompt + generated tokens, still eligible for prefix hits). No new request
    is admitted in a step in which a preemption happened (as in vLLM).
  * Step time = decode_ms/1000 + prefill_tokens/prefill_tps
                + sum over scheduled chunks c*(p + c/2)*attn_us*1e-6   (p = context offset)
                + 0.05 ms * decoding sequences,
    times a lognormal(0, --jitter) factor. One asyncio task sleeps to a monotonic
    deadline per step (late wake-ups are absorbed by the next step); idle when empty.
  * A token is sampled at the end of the step that completes a (re)prefill and at the
    end of every decode step; finish_reason "length" at max_tokens (chat:
    max_completion_tokens or max_tokens; default 128, clipped to max_model_len).
  * Client disconnect (stream or not) aborts the request and frees its blocks.
HTTP (aiohttp, 127.0.0.1)
  * POST /v1/completions (prompt: str, [str], [int], [[int]]), POST /v1/chat/completions,
    streaming SSE ("data: {...}\\n\\n" ... "data: [DONE]\\n\\n") and non-streaming.
  * Chat streaming sends a role-only delta {"role":"assistant","content":""} first, as
    soon as the request is accepted (--role-at-first-token defers it to the first
    token, which is what vLLM's serving_chat actually does). Stream deltas of
    several tokens are merged when the client lags (vLLM v1 output collector).
  * stream_options.include_usage -> final chunk with choices=[] and usage;
    continuous_usage_stats -> usage on every chunk. stream_options without stream -> 400.
  * usage = {prompt_tokens, total_tokens, completion_tokens,
    prompt_tokens_details: {cached_tokens}} (details absent with --no-cached-report).
  * Errors use vLLM's body {"object":"error","message","type","param","code"}:
    bad JSON / missing or bad fields -> 400 BadRequestError; unknown model -> 404
    NotFoundError; prompt_tokens + max_tokens > max_model_len -> 400 with vLLM's text.
  * GET /v1/models, GET /health (200 empty; 404 with --no-health), GET /version
    ({"version":"0.9.0"}), GET /metrics (404 with --no-metrics). Unknown routes give
    FastAPI's {"detail":"Not Found"}; Server header "uvicorn"; X-Request-Id honoured.
Metrics (prometheus_client, own registry, no *_created series; labels model_name, engine="0")
  * gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
    (+ deprecated vllm:gpu_cache_usage_perc), vllm:cache_config_info (value 1).
  * counters vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (tokens, at
    admission; + deprecated vllm:gpu_prefix_cache_*), vllm:prompt_tokens_total,
    vllm:generation_tokens_total, vllm:num_preemptions_total,
    vllm:request_success_total{finished_reason=stop|length|abort} (aborts not counted).
  * histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds
    (+ vllm:time_per_output_token_seconds), vllm:e2e_request_latency_seconds,
    vllm:request_queue_time_seconds, vllm:request_prefill_time_seconds,
    vllm:request_decode_time_seconds, vllm:request_inference_time_seconds,
    vllm:request_prompt_tokens, vllm:request_generation_tokens, vllm:iteration_tokens_total.
Misc
  * --flavor sglang is accepted but the server still behaves as vLLM.
  * Quiet by default; --verbose logs one INFO line per finished/aborted request.
  * Bad flags -> one line on stderr, exit code 2.
"""
import argparse
import asyncio
import json
import logging
import math
import re
import signal
import sys
import time
import uuid
import zlib
from collections import OrderedDict, deque

import numpy as np
import prometheus_client
from aiohttp import web
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

VERSION = "0.9.0"
VOCAB = 50000
DEFAULT_MAX_TOKENS = 128
DECODE_SEQ_COST_S = 0.05e-3
log = logging.getLogger("foreign_replica_c")

# ----------------------------------------------------------------------------- tokenizer
_PIECE_RE = re.compile(r"\w+|[^\w\s]")
WORDS = ("the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as",
         "at", "be", "this", "from", "by", "or", "have", "an", "they", "not", "but",
         "what", "all", "were", "we", "when", "your", "can", "said", "use", "each",
         "she", "do", "how", "if", "will", "up", "out", "many", "then", "them", "so",
         "some", "her", "make", "like", "him", "into", "time", "has", "look", "two",
         "more", "go", "see", "no", "way", "my", "than", "been", "call", "who", "its",
         "now", "find", "long", "down", "day", "did", "get", "come", "made", "may")
_WORD_STEP = 7 if math.gcd(7, len(WORDS)) == 1 else 1


def token_id(piece):
    return zlib.crc32(piece.encode("utf-8")) % VOCAB


def tokenize(text):
    ids = []
    for m in _PIECE_RE.finditer(text):
        w = m.group()
        for i in range(0, len(w), 4):
            ids.append(token_id(w[i:i + 4]))
    return ids


def render_chat(messages):
    parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def filler_token(base, i):
    word = WORDS[(base + i * _WORD_STEP) % len(WORDS)]
    return " " + word, token_id(word)


# ----------------------------------------------------------------------------- KV cache
class Block:
    __slots__ = ("bid", "ref", "hash")

    def __init__(self, bid):
        self.bid, self.ref, self.hash = bid, 0, None


class KVCache:
    """vLLM v1 style block pool with a prefix cache over full blocks."""

    def __init__(self, num_blocks, block_size):
        self.bs = block_size
        self.num_blocks = num_blocks
        blocks = [Block(i) for i in range(num_blocks)]
        blocks[0].ref = 1  # null block, never handed out
        self.free = OrderedDict((b.bid, b) for b in blocks[1:])  # head = next evicted
        self.cached = {}  # block hash -> Block
        self.usable = num_blocks - 1

    def usage(self):
        return 1.0 - len(self.free) / self.usable

    def update_hashes(self, req):
        toks, bs, hs = req.tokens, self.bs, req.block_hashes
        while (len(hs) + 1) * bs <= len(toks):
            i = len(hs)
            hs.append(hash((hs[-1] if hs else 0, tuple(toks[i * bs:(i + 1) * bs]))))

    def computed_blocks(self, req):
        """Longest cached prefix of full blocks, at most num_tokens - 1 tokens."""
        self.update_hashes(req)
        hit = []
        for h in req.block_hashes[:(len(req.tokens) - 1) // self.bs]:
            b = self.cached.get(h)
            if b is None:
                break
            hit.append(b)
        return hit

    def allocate(self, req, num_computed, num_new, hit=()):
        """Reserve blocks for num_computed + num_new tokens; False if not enough free."""
        need = -(-(num_computed + num_new) // self.bs) - len(req.blocks) - len(hit)
        need = max(need, 0)
        if need + sum(1 for b in hit if b.ref == 0) > len(self.free):
            return False
        if not req.blocks:
            req.num_cached_blocks = len(hit)
        for b in hit:
            if b.ref == 0:
                del self.free[b.bid]
            b.ref += 1
            req.blocks.append(b)
        for _ in range(need):
            _, b = self.free.popitem(last=False)
            if b.hash is not None:
                if self.cached.get(b.hash) is b:
                    del self.cached[b.hash]
                b.hash = None
            b.ref = 1
            req.blocks.append(b)
        self._cache_full(req, min(num_computed + num_new, len(req.tokens)))
        return True

    def _cache_full(self, req, num_tokens):
        full = num_tokens // self.bs
        if full <= req.num_cached_blocks:
            return
        self.update_hashes(req)
        for i in range(req.num_cached_blocks, full):
            b, h = req.blocks[i], req.block_hashes[i]
            if b.hash is None and h not in self.cached:
                b.hash = h
                self.cached[h] = b
        req.num_cached_blocks = full

    def release(self, req):
        for b in reversed(req.blocks):  # tail blocks become the first evicted
            b.ref -= 1
            if b.ref == 0:
                self.free[b.bid] = b
        req.blocks = []
        req.num_cached_blocks = 0


# ----------------------------------------------------------------------------- metrics
class Metrics:
    TTFT_B = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
              5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    ITL_B = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0]
    REQ_B = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
    ITER_B = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]

    def __init__(self, cfg, num_blocks):
        prometheus_client.disable_created_metrics()
        self.registry = r = CollectorRegistry(auto_describe=True)
        L, lv = ["model_name", "engine"], (cfg.model, "0")

        def g(name, doc):
            return Gauge(name, doc, L, registry=r).labels(*lv)

        def c(name, doc):
            return Counter(name, doc, L, registry=r).labels(*lv)

        def h(name, doc, buckets):
            return Histogram(name, doc, L, buckets=buckets, registry=r).labels(*lv)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.gpu_usage = g("vllm:gpu_cache_usage_perc",
                           "GPU KV-cache usage. 1 means 100 percent usage. DEPRECATED: Use vllm:kv_cache_usage_perc instead.")
        self.pc_queries = c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")
        self.pc_hits = c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.gpu_pc_queries = c("vllm:gpu_prefix_cache_queries",
                                "GPU prefix cache queries. DEPRECATED: Use vllm:prefix_cache_queries instead.")
        self.gpu_pc_hits = c("vllm:gpu_prefix_cache_hits",
                             "GPU prefix cache hits. DEPRECATED: Use vllm:prefix_cache_hits instead.")
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.gen_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          L + ["finished_reason"], registry=r)
        self.success = {k: success.labels(*lv, k) for k in ("stop", "length", "abort")}
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.TTFT_B)
        self.itl = h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.ITL_B)
        self.tpot = h("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds. DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
                      self.ITL_B)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.REQ_B)
        self.queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", self.REQ_B)
        self.prefill = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", self.REQ_B)
        self.decode = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", self.REQ_B)
        self.inference = h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", self.REQ_B)
        tok_b = [b * m for m in (1, 10, 100, 1000, 10000, 100000) for b in (1, 2, 5) if b * m <= cfg.max_model_len]
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_b)
        self.req_gen = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tok_b)
        self.iter_tokens = h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", self.ITER_B)
        info = {"block_size": str(cfg.page_size), "cache_dtype": "auto", "calculate_kv_scales": "False",
                "cpu_offload_gb": "0", "enable_prefix_caching": "True", "gpu_memory_utilization": "0.9",
                "is_attention_free": "False", "num_cpu_blocks": "None", "num_gpu_blocks": str(num_blocks),
                "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "builtin",
                "sliding_window": "None", "swap_space": "4", "engine": "0"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
              list(info), registry=r).labels(**info).set(1)


# ----------------------------------------------------------------------------- engine
class Request:
    def __init__(self, rid, prompt_ids, max_tokens, arrival):
        self.rid = rid
        self.tokens = list(prompt_ids)  # prompt + generated token ids
        self.num_prompt = len(prompt_ids)
        self.max_tokens = max_tokens
        self.num_output = 0
        self.num_computed = 0
        self.blocks, self.block_hashes, self.num_cached_blocks = [], [], 0
        self.cached_tokens = None  # prefix hit at first scheduling (reported in usage)
        self.arrival = arrival
        self.scheduled_ts = self.first_token_ts = self.last_token_ts = None
        self.finished, self.finish_reason = False, None
        self.out = asyncio.Queue()  # (delta_text, num_output, finish_reason|None)
        self.base = zlib.crc32(",".join(map(str, prompt_ids[-64:])).encode())


class Engine:
    def __init__(self, cfg, metrics):
        self.cfg, self.m = cfg, metrics
        self.kv = KVCache(cfg.kv_tokens // cfg.page_size, cfg.page_size)
        self.waiting, self.running = deque(), []
        self.wake = asyncio.Event()
        self.rng = np.random.default_rng(cfg.seed)
        self.base_step_s = cfg.decode_ms / 1000.0

    # -- request lifecycle
    def add(self, req):
        self.waiting.append(req)
        self.m.waiting.set(len(self.waiting))
        self.wake.set()

    def abort(self, req):
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req)
        self._finish(req, "abort", time.monotonic())
        self._update_gauges()

    def _finish(self, req, reason, now):
        req.finished, req.finish_reason = True, reason
        e2e = now - req.arrival
        if reason != "abort":
            m = self.m
            m.success[reason].inc()
            m.e2e.observe(e2e)
            m.req_prompt.observe(req.num_prompt)
            m.req_gen.observe(req.num_output)
            m.decode.observe(now - req.first_token_ts)
            m.inference.observe(now - req.scheduled_ts)
        if log.isEnabledFor(logging.INFO):
            ttft = f"{req.first_token_ts - req.arrival:.3f}s" if req.first_token_ts else "-"
            log.info("request %s finished=%s prompt_tokens=%d cached_tokens=%s output_tokens=%d "
                     "ttft=%s e2e=%.3fs", req.rid, reason, req.num_prompt, req.cached_tokens,
                     req.num_output, ttft, e2e)

    def _preempt(self, req):
        self.kv.release(req)
        req.num_computed = 0
        self.waiting.appendleft(req)
        self.m.preemptions.inc()

    # -- scheduling (vLLM v1 Scheduler.schedule, FCFS)
    def schedule(self, now):
        budget, sched, preempted = self.cfg.chunk, [], False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(len(req.tokens) - req.num_computed, budget)
            ok = False
            while True:
                if self.kv.allocate(req, req.num_computed, num_new):
                    ok = True
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if not ok:
                break
            sched.append((req, num_new))
            budget -= num_new
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.cfg.max_running:
                req = self.waiting[0]
                hit = self.kv.computed_blocks(req)
                n_comp = len(hit) * self.kv.bs
                num_new = min(len(req.tokens) - n_comp, budget)
                if not self.kv.allocate(req, n_comp, num_new, hit):
                    break
                self.waiting.popleft()
                self.running.append(req)
                req.num_computed = n_comp
                self.m.pc_queries.inc(len(req.tokens))
                self.m.gpu_pc_queries.inc(len(req.tokens))
                self.m.pc_hits.inc(n_comp)
                self.m.gpu_pc_hits.inc(n_comp)
                if req.scheduled_ts is None:
                    req.scheduled_ts = now
                    req.cached_tokens = n_comp
                    self.m.queue.observe(now - req.arrival)
                sched.append((req, num_new))
                budget -= num_new
        return sched

    def step_duration(self, sched):
        prefill = attn = 0.0
        decodes = 0
        for req, n in sched:
            p = req.num_computed
            if n == 1 and req.num_output > 0 and p == len(req.tokens) - 1:
                decodes += 1
            else:
                prefill += n
            attn += n * (p + n / 2.0)
        dur = (self.base_step_s + prefill / self.cfg.prefill_tps
               + attn * self.cfg.attn_us * 1e-6 + decodes * DECODE_SEQ_COST_S)
        if self.cfg.jitter > 0:
            dur *= float(self.rng.lognormal(0.0, self.cfg.jitter))
        return dur

    def apply(self, sched, now):
        m = self.m
        m.iter_tokens.observe(sum(n for _, n in sched))
        for req, n in sched:
            if req.finished:  # aborted while the step was running
                continue
            req.num_computed += n
            if req.num_computed < len(req.tokens):
                continue  # partial (chunked) prefill: no token sampled
            text, tid = filler_token(req.base, req.num_output)
            req.tokens.append(tid)
            req.num_output += 1
            m.gen_tokens.inc()
            if req.first_token_ts is None:
                req.first_token_ts = now
                m.prompt_tokens.inc(req.num_prompt)
                m.ttft.observe(now - req.arrival)
                m.prefill.observe(now - req.scheduled_ts)
            else:
                m.itl.observe(now - req.last_token_ts)
                m.tpot.observe(now - req.last_token_ts)
            req.last_token_ts = now
            reason = None
            if req.num_output >= req.max_tokens or len(req.tokens) >= self.cfg.max_model_len:
                reason = "length"
                self.running.remove(req)
                self.kv.release(req)
                self._finish(req, reason, now)
            req.out.put_nowait((text, req.num_output, reason))

    def _update_gauges(self):
        self.m.running.set(len(self.running))
        self.m.waiting.set(len(self.waiting))
        u = self.kv.usage()
        self.m.kv_usage.set(u)
        self.m.gpu_usage.set(u)

    async def run(self):
        deadline = None
        while True:
            if not self.running and not self.waiting:
                self._update_gauges()
                self.wake.clear()
                await self.wake.wait()
                deadline = None
                continue
            now = time.monotonic()
            # a late wake-up (event-loop latency) is charged to the next step
            t0 = deadline if deadline is not None and 0 <= now - deadline < 0.005 else now
            sched = self.schedule(t0)
            self._update_gauges()
            if not sched:  # nothing schedulable (should not happen); avoid spinning
                deadline = None
                await asyncio.sleep(self.base_step_s or 0.001)
                continue
            deadline = t0 + self.step_duration(sched)
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.apply(sched, time.monotonic())
            self._update_gauges()


# ----------------------------------------------------------------------------- HTTP layer
def _dumps(obj):  # Starlette's JSONResponse rendering
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def json_response(obj, status=200):
    return web.json_response(obj, status=status, dumps=_dumps)


def error_response(message, status=400, err_type="BadRequestError"):
    return json_response({"object": "error", "message": message, "type": err_type,
                              "param": None, "code": status}, status=status)


class BadRequest(Exception):
    pass


def _pyd(kind, field, msg, value):
    return f"[{{'type': '{kind}', 'loc': ('body', '{field}'), 'msg': '{msg}', 'input': {value!r}}}]"


def _int_field(body, name):
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(_pyd("int_type", name, "Input should be a valid integer", v))
    return v


class Server:
    def __init__(self, cfg):
        self.cfg = cfg
        num_blocks = cfg.kv_tokens // cfg.page_size
        self.metrics = Metrics(cfg, num_blocks)
        self.engine = Engine(cfg, self.metrics)
        self.created = int(time.time())

    def build_app(self):
        app = web.Application(middlewares=[self.fastapi_errors], client_max_size=64 * 1024 ** 2)
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/version", self.version)
        if not self.cfg.no_health:
            r.add_get("/health", self.health)
        if not self.cfg.no_metrics:
            r.add_get("/metrics", self.metrics_handler)
        app.on_response_prepare.append(self._server_header)
        app.on_startup.append(self._start_engine)
        app.on_cleanup.append(self._stop_engine)
        return app

    async def _start_engine(self, app):
        self.engine_task = asyncio.get_running_loop().create_task(self.engine.run())

    async def _stop_engine(self, app):
        self.engine_task.cancel()

    @staticmethod
    async def _server_header(request, response):
        response.headers["Server"] = "uvicorn"

    @web.middleware
    async def fastapi_errors(self, request, handler):
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return json_response({"detail": "Not Found"}, status=404)
        except web.HTTPMethodNotAllowed:
            return json_response({"detail": "Method Not Allowed"}, status=405)

    # -- simple routes
    async def health(self, request):
        return web.Response(status=200)

    async def version(self, request):
        return json_response({"version": VERSION})

    async def metrics_handler(self, request):
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request):
        c = self.cfg
        perm = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": int(time.time()), "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}
        return json_response({"object": "list", "data": [{
            "id": c.model, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": c.model, "parent": None, "max_model_len": c.max_model_len,
            "permission": [perm]}]})

    # -- request parsing
    def _parse(self, body, chat):
        """Returns (prompt_ids, max_tokens, stream, include_usage, continuous_usage)."""
        if chat:
            msgs = body.get("messages")
            if msgs is None:
                raise BadRequest(_pyd("missing", "messages", "Field required", body))
            if not isinstance(msgs, list) or not msgs:
                raise BadRequest(_pyd("list_type", "messages", "Input should be a non-empty list", msgs))
            rendered = []
            for msg in msgs:
                if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                    raise BadRequest(_pyd("missing", "messages.role", "Field required", msg))
                content = msg.get("content")
                if content is None:
                    content = ""
                elif isinstance(content, list):
                    content = "\n".join(p.get("text", "") for p in content
                                        if isinstance(p, dict) and p.get("type") == "text")
                elif not isinstance(content, str):
                    raise BadRequest(_pyd("string_type", "messages.content", "Input should be a valid string", content))
                rendered.append({"role": msg["role"], "content": content})
            prompt_ids = tokenize(render_chat(rendered))
            max_tokens = _int_field(body, "max_completion_tokens")
            if max_tokens is None:
                max_tokens = _int_field(body, "max_tokens")
        else:
            p = body.get("prompt")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
                p = p[0]
            if isinstance(p, str) and p:
                prompt_ids = tokenize(p)
            elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and 0 <= t for t in p):
                prompt_ids = list(p)
            elif p is None or p == "" or p == []:
                raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.")
            elif isinstance(p, list) and all(isinstance(x, (str, list)) for x in p):
                raise BadRequest("Only a single prompt per request is supported by this server.")
            else:
                raise BadRequest(_pyd("union_tag_invalid", "prompt", "Input should be a string or a list of token ids", p))
            max_tokens = _int_field(body, "max_tokens")
        if not prompt_ids:
            raise BadRequest("The decoder prompt cannot be empty")
        n = _int_field(body, "n")
        if n is not None and n != 1:
            raise BadRequest("n > 1 is not supported by this server.")
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):
            raise BadRequest(_pyd("bool_type", "stream", "Input should be a valid boolean", stream))
        so = body.get("stream_options")
        if so is not None:
            if not stream:
                raise BadRequest("Stream options can only be defined when `stream=True`.")
            if not isinstance(so, dict):
                raise BadRequest(_pyd("model_type", "stream_options", "Input should be a valid dictionary", so))
        so = so or {}
        include_usage = bool(so.get("include_usage"))
        continuous = include_usage and bool(so.get("continuous_usage_stats"))
        plen, mml = len(prompt_ids), self.cfg.max_model_len
        if max_tokens is not None and max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
        if max_tokens is None:
            if plen >= mml:
                raise BadRequest(
                    f"This model's maximum context length is {mml} tokens. However, you requested "
                    f"{plen} tokens in the messages, Please reduce the length of the messages.")
            max_tokens = min(DEFAULT_MAX_TOKENS, mml - plen)
        elif plen + max_tokens > mml:
            raise BadRequest(
                f"This model's maximum context length is {mml} tokens. However, you requested "
                f"{plen + max_tokens} tokens ({plen} in the messages, {max_tokens} in the "
                f"completion). Please reduce the length of the messages or completion.")
        return prompt_ids, max_tokens, stream, include_usage, continuous

    def _usage(self, req, details=True):
        u = {"prompt_tokens": req.num_prompt, "total_tokens": req.num_prompt + req.num_output,
             "completion_tokens": req.num_output}
        if details and not self.cfg.no_cached_report:
            u["prompt_tokens_details"] = {"cached_tokens": req.cached_tokens or 0}
        return u

    # -- endpoints
    async def completions(self, request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request):
        return await self._generate(request, chat=True)

    async def _generate(self, request, chat):
        arrival = time.monotonic()
        created = int(time.time())
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as e:
            msg = getattr(e, "msg", str(e))
            pos = getattr(e, "pos", 0)
            return error_response(f"[{{'type': 'json_invalid', 'loc': ('body', {pos}), 'msg': "
                                  f"'JSON decode error', 'input': {{}}, 'ctx': {{'error': '{msg}'}}}}]")
        if not isinstance(body, dict):
            return error_response(_pyd("model_attributes_type", "", "Input should be a valid dictionary "
                                       "or object to extract fields from", body))
        model = body.get("model")
        if model is not None and model != self.cfg.model:
            return error_response(f"The model `{model}` does not exist.", 404, "NotFoundError")
        try:
            prompt_ids, max_tokens, stream, inc_usage, cont_usage = self._parse(body, chat)
        except BadRequest as e:
            return error_response(str(e))
        base_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        rid = ("chatcmpl-" if chat else "cmpl-") + base_id
        req = Request(rid, prompt_ids, max_tokens, arrival)
        self.engine.add(req)
        try:
            if stream:
                return await self._stream(request, req, chat, created, inc_usage, cont_usage)
            text = []
            while True:
                delta, _, fin = await req.out.get()
                text.append(delta)
                if fin:
                    break
            return json_response(self._full_response(req, chat, created, "".join(text)))
        finally:
            if not req.finished:  # client went away (cancelled handler / reset stream)
                self.engine.abort(req)

    def _full_response(self, req, chat, created, text):
        obj = "chat.completion" if chat else "text_completion"
        common = {"id": req.rid, "object": obj, "created": created, "model": self.cfg.model}
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "reasoning_content": None,
                                              "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}
            return {**common, "choices": [choice],
                    "usage": self._usage(req), "prompt_logprobs": None, "kv_transfer_params": None}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}
        return {**common, "choices": [choice],
                "usage": self._usage(req), "kv_transfer_params": None}

    async def _stream(self, request, req, chat, created, inc_usage, cont_usage):
        resp = web.StreamResponse(status=200, headers={
            "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": req.rid, "object": obj, "created": created, "model": self.cfg.model}

        def running_usage(n_out):
            return {"prompt_tokens": req.num_prompt, "total_tokens": req.num_prompt + n_out,
                    "completion_tokens": n_out}

        async def send(payload):
            await resp.write(b"data: " + _dumps(payload).encode() + b"\n\n")

        async def send_role():
            chunk = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}]}
            if cont_usage:
                chunk["usage"] = running_usage(0)
            await send(chunk)

        try:
            await resp.prepare(request)
            role_pending = chat
            if chat and not self.cfg.role_at_first_token:
                await send_role()
                role_pending = False
            while True:
                text, n_out, fin = await req.out.get()
                while fin is None and not req.out.empty():  # merge if the client lags
                    t2, n_out, fin = req.out.get_nowait()
                    text += t2
                if role_pending:
                    await send_role()
                    role_pending = False
                if chat:
                    choice = {"index": 0, "delta": {"content": text}, "logprobs": None,
                              "finish_reason": fin}
                    if fin:
                        choice["stop_reason"] = None
                    chunk = {**head, "choices": [choice]}
                    if cont_usage:
                        chunk["usage"] = running_usage(n_out)
                else:
                    chunk = {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                  "finish_reason": fin, "stop_reason": None}],
                             "usage": running_usage(n_out) if cont_usage else None}
                await send(chunk)
                if fin:
                    break
            if inc_usage:
                await send({**head, "choices": [], "usage": self._usage(req)})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # client disconnected; _generate's finally aborts the request
        return resp


# ----------------------------------------------------------------------------- CLI
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def parse_args(argv=None):
    p = _Parser(prog="foreign_replica_c", description="Emulated vLLM v1 OpenAI server (no model, no GPU).")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="foreign-model")
    p.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-tokens", type=int, default=65536)
    p.add_argument("--chunk", type=int, default=8192)
    p.add_argument("--decode-ms", type=float, default=12.0)
    p.add_argument("--prefill-tps", type=float, default=10000.0)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--no-health", action="store_true")
    p.add_argument("--no-metrics", action="store_true")
    p.add_argument("--no-cached-report", action="store_true")
    p.add_argument("--attn-us", type=float, default=0.02)
    p.add_argument("--jitter", type=float, default=0.05)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--role-at-first-token", action="store_true",
                   help="send the chat role chunk with the first token (vLLM source behaviour)")
    p.add_argument("--verbose", action="store_true", help="log one INFO line per request")
    a = p.parse_args(argv)

    def finite(x):
        return math.isfinite(x)

    checks = [
        (1 <= a.port <= 65535, f"--port must be in 1..65535, got {a.port}"),
        (a.model.strip() != "", "--model must not be empty"),
        (a.page_size >= 1, f"--page-size must be >= 1, got {a.page_size}"),
        (a.kv_tokens >= 2 * a.page_size, f"--kv-tokens must be >= 2 * page-size ({2 * a.page_size}), got {a.kv_tokens}"),
        (a.chunk >= 1, f"--chunk must be >= 1, got {a.chunk}"),
        (finite(a.decode_ms) and a.decode_ms >= 0, f"--decode-ms must be a finite value >= 0, got {a.decode_ms}"),
        (finite(a.prefill_tps) and a.prefill_tps > 0, f"--prefill-tps must be a finite value > 0, got {a.prefill_tps}"),
        (a.max_running >= 1, f"--max-running must be >= 1, got {a.max_running}"),
        (finite(a.attn_us) and a.attn_us >= 0, f"--attn-us must be a finite value >= 0, got {a.attn_us}"),
        (finite(a.jitter) and 0 <= a.jitter <= 2, f"--jitter must be in [0, 2], got {a.jitter}"),
        (a.max_model_len >= 2, f"--max-model-len must be >= 2, got {a.max_model_len}"),
        (a.chunk >= a.max_running,
         f"--chunk (max_num_batched_tokens={a.chunk}) must be greater than or equal to "
         f"--max-running (max_num_seqs={a.max_running})"),
    ]
    for ok, msg in checks:
        if not ok:
            p.error(msg)
    capacity = (a.kv_tokens // a.page_size - 1) * a.page_size
    if a.max_model_len > capacity:
        p.error(f"The model's max seq len ({a.max_model_len}) is larger than the maximum number of "
                f"tokens that can be stored in KV cache ({capacity}); raise --kv-tokens or lower --max-model-len")
    return a


async def serve(cfg):
    server = Server(cfg)
    runner = web.AppRunner(server.build_app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", cfg.port)
    try:
        await site.start()
    except OSError as e:
        sys.stderr.write(f"foreign_replica_c: cannot bind 127.0.0.1:{cfg.port}: {e.strerror}\n")
        await runner.cleanup()
        return 1
    log.info("serving %s on http://127.0.0.1:%d (vLLM %s emulation)", cfg.model, cfg.port, VERSION)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def main(argv=None):
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.INFO if cfg.verbose else logging.WARNING,
                        format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    for name in ("aiohttp.server", "aiohttp.access", "aiohttp.web", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        return asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
