#!/usr/bin/env python3
# ruff: noqa: E501, B023
# Kept as its author wrote it (benchmarks/foreign_fleet.py says who and why): the lint rules
# above are ours, not its author's.
"""Foreign replica: a small emulated OpenAI-compatible LLM server that behaves, from the
outside, roughly like a vLLM / SGLang instance (continuous batching, chunked prefill,
page-granular prefix cache with LRU eviction, Prometheus gauges). Written independently."""
import argparse
import asyncio
import collections
import json
import random
import re
import string
import sys
import time
import uuid
import zlib

from aiohttp import web

ENG = None  # the Engine, created in main()
TOK_RE = re.compile(r"\w+|[^\w\s]")


def tokenize(text):
    """Regex tokens; a word longer than 6 characters is split in halves (2 tokens)."""
    toks = []
    for t in TOK_RE.findall(text):
        if len(t) > 6:
            h = len(t) // 2
            toks += [t[:h], t[h:]]
        else:
            toks.append(t)
    return [zlib.crc32(t.encode()) for t in toks]


def content_text(c):
    if c is None or isinstance(c, str):
        return c or ""
    if isinstance(c, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    raise ValueError("bad content")


class Req:
    def __init__(self, ids, max_tokens):
        self.prompt, self.max_tokens = ids, max_tokens
        self.out = []                 # generated token ids
        self.q = asyncio.Queue()      # words for the HTTP handler; None = end
        self.keys = []                # cache pages held (refcounted), a prefix chain of seq
        self.reserved = 0             # private (not yet full / not yet computed) pages
        self.computed = self.target = 0
        self.prefilled = self.done = False
        self.cached = None            # cached tokens reported (from first admission)

    def seq(self):
        return self.prompt + self.out


class Engine:
    def __init__(self, a):
        self.a, self.ps, self.cap = a, a.page_size, a.kv_tokens // a.page_size
        self.cache = collections.OrderedDict()  # page key -> refcount, LRU order (oldest first)
        self.waiting, self.running = collections.deque(), []
        self.wake = asyncio.Event()
        self.rng = random.Random(a.seed)

    # ---- page accounting -------------------------------------------------------------
    def used(self):
        return len(self.cache) + sum(r.reserved for r in self.running)

    def busy(self):  # pages held by running requests (what vLLM/SGLang report as usage)
        return sum(1 for v in self.cache.values() if v > 0) + sum(r.reserved for r in self.running)

    def free_up(self, n):
        """Ensure n free pages, evicting least recently used unreferenced pages."""
        short = n - (self.cap - self.used())
        if short <= 0:
            return True
        victims = [k for k, v in self.cache.items() if v == 0][:short]
        if len(victims) < short:
            return False
        for k in victims:
            del self.cache[k]
        return True

    def page_key(self, parent, seq, i):
        return hash((parent, tuple(seq[i * self.ps:(i + 1) * self.ps])))

    def match(self, seq):
        keys, parent = [], None
        for i in range(len(seq) // self.ps):
            k = self.page_key(parent, seq, i)
            if k not in self.cache:
                break
            keys.append(k)
            parent = k
        return keys

    def admit(self, r):
        seq = r.seq()
        keys = self.match(seq)
        for k in keys:
            self.cache[k] += 1
        need = -(-len(seq) // self.ps) - len(keys)
        if not self.free_up(need):
            for k in keys:
                self.cache[k] -= 1
            return False
        r.keys, r.reserved, r.target = keys, need, len(seq)
        r.computed = min(len(keys) * self.ps, len(seq) - 1)
        r.prefilled = False
        if r.cached is None:
            r.cached = r.computed
        return True

    def commit(self, r):
        """Publish the request's newly completed full pages into the prefix cache."""
        seq = None
        while (len(r.keys) + 1) * self.ps <= r.computed:
            seq = r.seq() if seq is None else seq
            k = self.page_key(r.keys[-1] if r.keys else None, seq, len(r.keys))
            if k in self.cache:
                self.cache[k] += 1
                self.cache.move_to_end(k)
            else:
                self.cache[k] = 1
            r.keys.append(k)
            r.reserved -= 1

    def release(self, r):
        for k in reversed(r.keys):  # leaves end up older than roots -> evicted first
            self.cache[k] -= 1
            self.cache.move_to_end(k)
        r.keys, r.reserved = [], 0

    def reserve(self, r, ntok):
        """Room for ntok tokens of r; preempts the newest running requests if short."""
        need = -(-ntok // self.ps) - len(r.keys) - r.reserved
        while need > 0 and not self.free_up(need):
            v = self.running.pop()  # recompute-style preemption of the newest request
            self.release(v)
            self.waiting.appendleft(v)
            if v is r:
                return False
        r.reserved += max(need, 0)
        return True

    # ---- request lifecycle -------------------------------------------------------------
    def submit(self, r):
        self.waiting.append(r)
        self.wake.set()

    def abort(self, r):
        r.done = True
        if r in self.waiting:
            self.waiting.remove(r)
        elif r in self.running:
            self.running.remove(r)
            self.release(r)

    def emit(self, r):
        w = "".join(self.rng.choice(string.ascii_lowercase) for _ in range(self.rng.randint(2, 6)))
        r.out.append(zlib.crc32(w.encode()))
        r.computed = len(r.prompt) + len(r.out)
        self.commit(r)
        r.q.put_nowait(w)
        if len(r.out) >= r.max_tokens:
            self.running.remove(r)
            self.release(r)
            r.done = True
            r.q.put_nowait(None)

    def shutdown(self):
        for r in list(self.waiting) + self.running:
            r.done = True
            r.q.put_nowait(None)
        self.waiting.clear()
        self.running.clear()

    async def loop(self):
        a = self.a
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                continue
            decode = []  # 1. one token for every prefilled request (oldest first)
            for r in list(self.running):
                if r.prefilled and r in self.running and self.reserve(r, len(r.prompt) + len(r.out) + 1):
                    decode.append(r)
            budget, npre, finishing = a.chunk, 0, []  # 2. chunked prefill, FCFS

            def prefill(r):
                nonlocal budget, npre
                n = min(r.target - r.computed, budget)
                r.computed += n
                budget -= n
                npre += n
                if r.computed >= r.target:
                    finishing.append(r)
            for r in self.running:
                if not r.prefilled and budget > 0:
                    prefill(r)
            while budget > 0 and self.waiting and len(self.running) < a.max_running:
                if not self.admit(self.waiting[0]):
                    break
                r = self.waiting.popleft()
                self.running.append(r)
                prefill(r)
            if not decode and not npre:  # nothing runnable (should not happen); avoid spinning
                await asyncio.sleep(0.01)
                continue
            await asyncio.sleep(a.decode_ms / 1000 + npre / a.prefill_tps)
            for r in decode:  # aborted/preempted requests are no longer in running
                if r in self.running:
                    self.emit(r)
            for r in finishing:
                if r in self.running:
                    r.prefilled = True
                    self.commit(r)
                    self.emit(r)


# ---- HTTP layer ----------------------------------------------------------------------
def err(msg, status=400, typ="BadRequestError"):
    return web.json_response({"error": {"message": msg, "type": typ, "param": None, "code": status}},
                             status=status)


async def completions(request, chat):
    eng = ENG
    a = eng.a
    try:
        body = await request.json()
    except Exception:
        return err("Invalid JSON in request body.")
    if not isinstance(body, dict):
        return err("Request body must be a JSON object.")
    try:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return err("Field 'messages' is required and must be a non-empty list.")
            text = "".join(f"<|{m.get('role', 'user')}|>\n{content_text(m.get('content'))}\n"
                           for m in msgs) + "<|assistant|>\n"
            ids = tokenize(text)
        else:
            p = body.get("prompt")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
                p = p[0]
            if isinstance(p, str):
                ids = tokenize(p)
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                ids = list(p)
            else:
                return err("Field 'prompt' is required (a string or a list of token ids).")
    except (AttributeError, TypeError, ValueError):
        return err("Malformed 'messages': each message must be an object with role and content.")
    if not ids:
        return err("The prompt must not be empty.")
    mt = body.get("max_completion_tokens")
    mt = body.get("max_tokens") if mt is None else mt
    mt = 64 if mt is None else mt
    if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
        return err("max_tokens must be a positive integer.")
    if -(-(len(ids) + mt) // eng.ps) > eng.cap:
        return err(f"This model's maximum context length is {eng.cap * eng.ps} tokens. However, you "
                   f"requested {len(ids) + mt} tokens ({len(ids)} in the messages, {mt} in the completion).")
    stream = body.get("stream") is True
    so = body.get("stream_options")
    if so is not None and not stream:
        return err("Stream options can only be defined when `stream=True`.")
    include_usage = isinstance(so, dict) and bool(so.get("include_usage"))

    r = Req(ids, mt)
    eng.submit(r)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    obj = ("chat.completion" if chat else "text_completion")

    def usage(n):
        u = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
        if not a.no_cached_report:
            u["prompt_tokens_details"] = {"cached_tokens": r.cached or 0}
        return u

    try:
        if not stream:
            words = []
            while (w := await r.q.get()) is not None:
                words.append(w)
            text = " ".join(words)
            fin = "length" if len(words) >= mt else "abort"
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                       "finish_reason": fin} if chat else
                      {"index": 0, "text": text, "logprobs": None, "finish_reason": fin})
            return web.json_response({"id": rid, "object": obj, "created": created, "model": a.model,
                                      "choices": [choice], "usage": usage(len(words))})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        cobj = obj + ".chunk" if chat else obj

        async def send(choices, **extra):
            d = {"id": rid, "object": cobj, "created": created, "model": a.model, "choices": choices, **extra}
            await resp.write(b"data: " + json.dumps(d).encode() + b"\n\n")
        try:
            if chat:
                await send([{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}])
            n = 0
            while (w := await r.q.get()) is not None:
                piece = w if n == 0 else " " + w
                n += 1
                fin = "length" if n >= mt else None
                await send([{"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": fin}
                            if chat else {"index": 0, "text": piece, "logprobs": None, "finish_reason": fin}])
            if include_usage:
                await send([], usage=usage(n))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return resp
    finally:
        if not r.done:
            eng.abort(r)


async def models(request):
    a = ENG.a
    return web.json_response({"object": "list", "data": [{
        "id": a.model, "object": "model", "created": int(time.time()), "owned_by": "foreign",
        "root": a.model, "parent": None, "max_model_len": a.kv_tokens}]})


async def health(request):
    return web.Response(status=200)


async def metrics(request):
    eng = ENG
    a = eng.a
    run, wait, use = len(eng.running), len(eng.waiting), eng.busy() / max(eng.cap, 1)
    if a.flavor == "vllm":
        rows = [("vllm:num_requests_running", run, "Number of requests in model execution batches."),
                ("vllm:num_requests_waiting", wait, "Number of requests waiting to be processed."),
                ("vllm:kv_cache_usage_perc", use, "KV-cache usage. 1 means 100 percent usage.")]
    else:
        rows = [("sglang:num_running_reqs", run, "The number of running requests."),
                ("sglang:num_queue_reqs", wait, "The number of requests in the waiting queue."),
                ("sglang:token_usage", use, "The token usage.")]
    lines = []
    for name, val, hlp in rows:
        lines += [f"# HELP {name} {hlp}", f"# TYPE {name} gauge", f'{name}{{model_name="{a.model}"}} {float(val)}']
    return web.Response(body=("\n".join(lines) + "\n").encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def main():
    ap = argparse.ArgumentParser(description="Emulated vLLM/SGLang-like inference server")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="foreign-model")
    ap.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--chunk", type=int, default=2048, help="prefill token budget per step")
    ap.add_argument("--decode-ms", type=float, default=15.0)
    ap.add_argument("--prefill-tps", type=float, default=10000.0)
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-health", action="store_true")
    ap.add_argument("--no-metrics", action="store_true")
    ap.add_argument("--no-cached-report", action="store_true")
    a = ap.parse_args()
    if a.page_size < 1 or a.chunk < 1 or a.max_running < 1 or a.prefill_tps <= 0 or a.kv_tokens < a.page_size:
        ap.error("page-size, chunk, max-running, prefill-tps must be positive; kv-tokens >= page-size")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", lambda req: completions(req, True))
    app.router.add_post("/v1/completions", lambda req: completions(req, False))
    app.router.add_get("/v1/models", models)
    if not a.no_health:
        app.router.add_get("/health", health)
    if not a.no_metrics:
        app.router.add_get("/metrics", metrics)

    global ENG
    ENG = Engine(a)
    tasks = []

    async def start(app):
        tasks.append(asyncio.create_task(ENG.loop()))

    async def stop(app):
        tasks[0].cancel()
        ENG.shutdown()
    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    print(f"foreign replica ({a.flavor}) on http://127.0.0.1:{a.port}", file=sys.stderr, flush=True)
    web.run_app(app, host="127.0.0.1", port=a.port, print=None, shutdown_timeout=2)  # handles SIGINT/SIGTERM


if __name__ == "__main__":
    main()
