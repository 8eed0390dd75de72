#!/usr/bin/env python3
# ruff: noqa
# Kept as its author wrote it (benchmarks/foreign_fleet.py says who and why): the lint rules
# are ours, not its author's.
"""Emulated LLM inference server (no model): looks like SGLang or vLLM on a GPU.

It sleeps for modelled compute time and emits deterministic filler tokens, in
real time.  Behaviours modelled:

* OpenAI API: POST /v1/completions, POST /v1/chat/completions (streaming SSE and
  non-streaming), GET /v1/models, GET /health (200, empty body), GET /metrics
  (Prometheus text, SGLang or vLLM metric names).  Errors are 400 JSON bodies.
* Own deterministic tokenizer: words/punctuation, words cut into <=3-char pieces,
  id = crc32(piece) % 50000.  Chat is rendered as "<|role|>\\n content \\n" per
  message + "<|assistant|>\\n".  Filler output words are <=3-char pieces, so a
  follow-up turn that includes the reply re-tokenizes to prompt + output ids.
* Prefix cache: page-granular radix tree (--page-size) over token ids, shared
  KV pool of --kv-tokens with running sequences; prompt pages inserted after
  prefill, the full sequence inserted on finish/abort/retract; LRU eviction of
  unreferenced leaves (batched, >= pool/64 per eviction); pages of running
  requests are pinned (lock counts up the path).  At most len(prompt)-1 tokens
  can come from cache (at least one token is always computed).
* Admission: FCFS waiting queue; admitted while admitted < --max-running and
  free+evictable KV >= uncached prompt + min(remaining output, 256) + reserve
  of running requests (SGLang-like new_token_ratio, 0.7 decaying to 0.1).
* Retraction: if the pool cannot hold one more token per decoding request, the
  newest admitted request is preempted back to the head of the queue (its
  sequence goes to the cache) and recomputed later (prompt + output so far).
* Step loop (one asyncio task, asyncio.sleep to a monotonic deadline):
  prefill pass of T tokens = T/--prefill-tps + 2 ms; decode step =
  --decode-ms + --decode-per-seq-ms*n + --decode-per-kv-token-us*ctx/1000 ms.
  --schedule prefill-first (SGLang): a prefill pass (budget --chunk, several
  requests, one long prompt chunked across passes) pre-empts decode whenever
  something is admissible; decode-first (vLLM v1): each step = all decodes plus
  prefill chunks within --chunk minus #decodes tokens, cost = sum of both.
* First token at the end of the pass completing prefill, then one per decode
  step until max_tokens / max_completion_tokens (default 128); always
  finish_reason "length".  Client disconnect aborts the request (KV freed).
* Streaming quirks: sglang chat sends the role chunk together with the first
  token; vllm chat sends a role-only chunk as soon as the request is accepted.
  stream_options.include_usage adds a choices=[] usage chunk before [DONE].
* usage.prompt_tokens_details.cached_tokens (unless --no-cached-report).
* Metrics use the real semantics of "usage": sglang:token_usage and
  vllm:kv_cache_usage_perc count KV held by running requests (private + their
  pinned cached prefix); evictable cache counts as free, as in both engines.
"""
import argparse, asyncio, heapq, json, logging, re, signal, time, uuid, zlib  # noqa: E401
from collections import deque

from aiohttp import web
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, disable_created_metrics,
                               Gauge, Histogram, generate_latest)

log = logging.getLogger("replica")
disable_created_metrics()
RESERVE_CAP = 256          # output tokens reserved per request at admission
LAUNCH_S = 0.002           # fixed cost of a prefill forward pass
WAIT, PRE, DEC, DONE = range(4)

# ----------------------------------------------------------------- tokenizer
_WORD_RE = re.compile(r"\w+|[^\w\s]")
_IDS = {}


def piece_id(p):
    i = _IDS.get(p)
    if i is None:
        if len(_IDS) > 1_000_000:
            _IDS.clear()
        i = _IDS[p] = zlib.crc32(p.encode()) % 50000
    return i


def tokenize(text):
    out = []
    for w in _WORD_RE.findall(text):
        if len(w) <= 3:
            out.append(piece_id(w))
        else:
            out.extend(piece_id(w[i:i + 3]) for i in range(0, len(w), 3))
    return out


def render_chat(messages):
    parts = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError("each message needs a string 'role'")
        c = m.get("content")
        if c is None:
            c = ""
        elif isinstance(c, list):
            c = "".join(p.get("text", "") for p in c if isinstance(p, dict))
        elif not isinstance(c, str):
            raise ValueError("message content must be a string or a list of parts")
        parts.append(f"<|{m['role']}|>\n{c}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


VOCAB = [a + b + c for a in "bdfgklmnprstvz" for b in "aeiou" for c in "nrstlk"]
VOCAB_IDS = [piece_id(w) for w in VOCAB]


def common_len(a, b):
    """Length of the common prefix of two tuples (slice compares run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# -------------------------------------------------------------- radix cache
class Node:
    __slots__ = ("key", "children", "parent", "lock", "atime")

    def __init__(self, key, parent):
        self.key, self.children, self.parent = key, {}, parent
        self.lock, self.atime = 0, time.monotonic()


class RadixCache:
    """Compressed radix tree over token ids; edges are whole pages."""

    def __init__(self, page):
        self.P = page
        self.root = Node((), None)
        self.root.lock = 1
        self.total = 0       # tokens held by the tree
        self.evictable = 0   # tokens in nodes with lock == 0

    def _split(self, child, c):
        P, k = self.P, child.key
        mid = Node(k[:c], child.parent)
        mid.lock, mid.atime = child.lock, child.atime
        child.parent.children[k[:P]] = mid
        child.key, child.parent = k[c:], mid
        mid.children[child.key[:P]] = child
        return mid

    def match(self, ids):
        """Longest cached page-aligned prefix of ids -> (length, node)."""
        P = self.P
        ids = ids[:len(ids) - len(ids) % P]
        node, pos, n, now = self.root, 0, len(ids), time.monotonic()
        while pos < n:
            child = node.children.get(ids[pos:pos + P])
            if child is None:
                break
            k = child.key
            c = common_len(k, ids[pos:pos + len(k)])
            c -= c % P
            child.atime = now
            if c < len(k):
                return pos + c, self._split(child, c)
            pos, node = pos + c, child
        return pos, node

    def insert(self, ids):
        """Insert the page-aligned part of ids; returns the node ending it."""
        ids = ids[:len(ids) - len(ids) % self.P]
        pos, node = self.match(ids)
        if pos < len(ids):
            leaf = Node(ids[pos:], node)
            node.children[leaf.key[:self.P]] = leaf
            self.total += len(leaf.key)
            self.evictable += len(leaf.key)
            node = leaf
        return node

    def lock(self, node):
        while node is not self.root:
            if node.lock == 0:
                self.evictable -= len(node.key)
            node.lock += 1
            node = node.parent

    def unlock(self, node):
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable += len(node.key)
            node = node.parent

    def evict(self, n):
        """Free >= n tokens (if possible) from unlocked leaves, LRU first."""
        heap, stack = [], [self.root]
        while stack:
            nd = stack.pop()
            if nd.children:
                stack.extend(nd.children.values())
            elif nd.lock == 0:
                heap.append((nd.atime, id(nd), nd))
        heapq.heapify(heap)
        freed = 0
        while freed < n and heap:
            _, _, nd = heapq.heappop(heap)
            p = nd.parent
            del p.children[nd.key[:self.P]]
            k = len(nd.key)
            freed += k
            self.total -= k
            self.evictable -= k
            if p is not self.root and not p.children and p.lock == 0:
                heapq.heappush(heap, (p.atime, id(p), p))
        return freed


# ------------------------------------------------------------------ engine
class Req:
    __slots__ = ("prompt", "fill", "max_new", "out", "state", "node", "tree_len",
                 "kv", "done_pre", "cached", "arrival", "sched", "first",
                 "stream", "ev", "finished", "aborted", "h")

    def __init__(self, prompt, max_new, stream, seed):
        self.prompt = self.fill = tuple(prompt)
        self.max_new, self.stream = max_new, stream
        self.out, self.state, self.node = [], WAIT, None
        self.tree_len = self.kv = self.done_pre = 0
        self.cached = self.sched = self.first = None
        self.arrival = time.monotonic()
        self.ev = asyncio.Event()
        self.finished = self.aborted = False
        self.h = (zlib.crc32(repr(self.prompt[-16:]).encode()) ^ seed) & 0xFFFFFFF

    def seq(self):
        return self.prompt + tuple(VOCAB_IDS[i] for i in self.out)


class Engine:
    def __init__(self, a, metrics):
        self.a, self.m = a, metrics
        self.P = a.page_size
        self.cache = RadixCache(a.page_size)
        self.waiting, self.running = deque(), []   # running = admitted, in order
        self.private = 0        # KV tokens owned by requests, not in the tree
        self.ratio = 0.7        # SGLang-like new_token_ratio for reservations
        self.hit_rate = 0.0
        self.wake = asyncio.Event()
        self.seed = a.seed or 0

    # ---- KV accounting
    def free(self):
        return self.a.kv_tokens - self.cache.total - self.private

    def used(self):
        return self.cache.total - self.cache.evictable + self.private

    def alloc(self, n):
        short = n - self.free()
        if short > 0:
            if short > self.cache.evictable:
                return False
            self.cache.evict(max(short, self.a.kv_tokens // 64))
        self.private += n
        return True

    def _release(self, r, insert):
        if insert:   # SGLang caches the computed sequence of a leaving request
            aligned = r.kv - r.kv % self.P
            if aligned > r.tree_len:
                self.cache.insert(r.seq()[:aligned])
        self.private -= r.kv - r.tree_len
        if r.node is not None:
            self.cache.unlock(r.node)
        r.node, r.kv, r.tree_len = None, 0, 0

    # ---- request lifecycle
    def submit(self, prompt, max_new, stream):
        if not prompt:
            raise ValueError("The prompt is empty.")
        if len(prompt) + max_new > self.a.kv_tokens:
            raise ValueError(f"Requested {len(prompt)} prompt + {max_new} output tokens "
                             f"exceeds the KV capacity of {self.a.kv_tokens} tokens.")
        r = Req(prompt, max_new, stream, self.seed)
        self.waiting.append(r)
        self.wake.set()
        return r

    def abort(self, r):
        if r.state == DONE or r.aborted:
            return
        r.aborted = True
        if r.state == WAIT:
            self.waiting.remove(r)
            r.state = DONE
        self.wake.set()   # running ones are released by _sweep

    def _sweep(self):
        keep = []
        for r in self.running:
            if r.aborted and r.state != DONE:
                self._release(r, r.state == DEC)
                r.state = DONE
            if r.state != DONE:
                keep.append(r)
        self.running = keep

    def _reserved(self):
        return self.ratio * sum(min(r.max_new - len(r.out), RESERVE_CAP) for r in self.running)

    def _try_admit(self, r, reserved):
        L = len(r.fill)
        m, node = self.cache.match(r.fill[:L - 1])
        self.cache.lock(node)
        need = L - m
        own = self.ratio * min(r.max_new - len(r.out), RESERVE_CAP)
        if need + own + reserved > self.free() + self.cache.evictable or not self.alloc(need):
            self.cache.unlock(node)
            return False
        r.node, r.tree_len, r.kv, r.done_pre, r.state = node, m, L, m, PRE
        r.sched = time.monotonic()
        if r.cached is None:
            r.cached = m
            self.m.on_admit(r)
        self.running.append(r)
        return True

    def _build_prefill(self, budget, several_chunked):
        batch, new_tok, new_cached = [], 0, 0
        for r in self.running:
            if r.state == PRE and budget > 0:
                t = min(budget, len(r.fill) - r.done_pre)
                batch.append((r, t))
                budget -= t
        if self.waiting and budget > 0 and len(self.running) < self.a.max_running:
            reserved = self._reserved()
            while self.waiting and budget > 0 and len(self.running) < self.a.max_running:
                r = self.waiting[0]
                if not self._try_admit(r, reserved):
                    break
                self.waiting.popleft()
                left = len(r.fill) - r.done_pre
                t = min(budget, left)
                batch.append((r, t))
                budget -= t
                new_tok += len(r.fill)
                new_cached += r.done_pre
                reserved += self.ratio * min(r.max_new - len(r.out), RESERVE_CAP)
                if t < left and not several_chunked:
                    break
        if new_tok:
            self.hit_rate = new_cached / new_tok
        return batch

    def _retract(self, r):
        self._release(r, r.state == DEC)
        self.ratio = 0.7
        if r.aborted:
            r.state = DONE
            return
        r.state, r.fill, r.done_pre = WAIT, r.seq(), 0
        self.waiting.appendleft(r)

    def _decodes(self):
        """Running decode requests with one new KV slot each (retracting if needed)."""
        dec = [r for r in self.running if r.state == DEC]
        while dec and not self.alloc(len(dec)):
            victim = self.running.pop()
            self._retract(victim)
            dec = [r for r in dec if r is not victim]
        for r in dec:
            r.kv += 1
        return dec

    def _emit(self, r, now):
        r.out.append((r.h + len(r.out) * 40503) % len(VOCAB))
        if r.first is None:
            r.first = now
            self.m.on_first(r, now)
        if len(r.out) >= r.max_new:
            self._release(r, True)
            r.state, r.finished = DONE, True
            r.ev.set()
        elif r.stream:
            r.ev.set()

    def _finish_prefill(self, r, now):
        L = len(r.fill)
        aligned = L - L % self.P
        if aligned > r.tree_len:
            node = self.cache.insert(r.fill[:aligned])
            self.cache.lock(node)
            self.cache.unlock(r.node)
            self.private -= aligned - r.tree_len
            r.node, r.tree_len = node, aligned
        r.state = DEC
        self._emit(r, now)

    async def _run(self, t0, dec, batch):
        a = self.a
        T = sum(t for _, t in batch)
        ms = 0.0
        if dec:
            ctx = sum(r.kv for r in dec)
            ms += a.decode_ms + a.decode_per_seq_ms * len(dec) + a.decode_per_kv_token_us * ctx / 1000
        if T:
            ms += 1000.0 * (T / a.prefill_tps + LAUNCH_S)
        await asyncio.sleep(max(0.0, t0 + ms / 1000 - time.monotonic()))
        now = time.monotonic()
        emitted = 0
        for r, t in batch:
            if not r.aborted and r.state == PRE:
                r.done_pre += t
                if r.done_pre >= len(r.fill):
                    self._finish_prefill(r, now)
                    emitted += 1
        for r in dec:
            if not r.aborted and r.state == DEC:
                self._emit(r, now)
                emitted += 1
        if dec:
            self.ratio = max(0.1, self.ratio - 0.001)
        if emitted:
            self.m.gen.inc(emitted)

    async def loop(self):
        prefill_first = self.a.schedule == "prefill-first"
        while True:
            try:
                self._sweep()
                t0 = time.monotonic()
                if prefill_first:
                    batch = self._build_prefill(self.a.chunk, False)
                    dec = [] if batch else self._decodes()
                else:
                    dec = self._decodes()
                    batch = self._build_prefill(self.a.chunk - len(dec), True)
                if dec or batch:
                    await self._run(t0, dec, batch)
                    continue
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.05 if self.waiting else None)
                except asyncio.TimeoutError:
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine step failed")
                await asyncio.sleep(0.01)


# ----------------------------------------------------------------- metrics
class Metrics:
    """Private Prometheus registry; gauges are refreshed at scrape time."""
    BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0]

    def __init__(self, a):
        self.reg, self.sglang = CollectorRegistry(), a.flavor == "sglang"

        def mk(cls, name, doc, **kw):
            return cls(name, doc, ["model_name"], registry=self.reg, **kw).labels(a.model)
        G, C, H, B = Gauge, Counter, Histogram, self.BUCKETS
        if self.sglang:
            self.running = mk(G, "sglang:num_running_reqs", "The number of running requests.")
            self.waiting = mk(G, "sglang:num_queue_reqs", "The number of requests in the waiting queue.")
            self.usage = mk(G, "sglang:token_usage", "The token usage.")
            self.used = mk(G, "sglang:num_used_tokens", "The number of used tokens.")
            mk(G, "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.").set(a.kv_tokens)
            self.hit = mk(G, "sglang:cache_hit_rate", "The prefix cache hit rate.")
            self.prompt = mk(C, "sglang:prompt_tokens", "Number of prefill tokens processed.")
            self.gen = mk(C, "sglang:generation_tokens", "Number of generation tokens processed.")
            self.cached = mk(C, "sglang:cached_tokens", "Number of cached prompt tokens.")
            self.ttft = mk(H, "sglang:time_to_first_token_seconds", "Time to first token.", buckets=B)
        else:
            self.running = mk(G, "vllm:num_requests_running", "Number of requests in model execution batches.")
            self.waiting = mk(G, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
            self.usage = mk(G, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
            self.prompt = mk(C, "vllm:prompt_tokens", "Number of prefill tokens processed.")
            self.gen = mk(C, "vllm:generation_tokens", "Number of generation tokens processed.")
            self.queries = mk(C, "vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.")
            self.hits = mk(C, "vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.")
            self.ttft = mk(H, "vllm:time_to_first_token_seconds", "Time to first token.", buckets=B)
            self.prefill = mk(H, "vllm:request_prefill_time_seconds", "Time spent in PREFILL phase.", buckets=B)
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", ["block_size", "num_gpu_blocks"],
                  registry=self.reg).labels(str(a.page_size), str(a.kv_tokens // a.page_size)).set(1)

    def on_admit(self, r):
        self.prompt.inc(len(r.prompt))
        if self.sglang:
            self.cached.inc(r.cached)
        else:
            self.queries.inc(len(r.prompt))
            self.hits.inc(r.cached)

    def on_first(self, r, now):
        self.ttft.observe(now - r.arrival)
        if not self.sglang:
            self.prefill.observe(now - r.sched)

    def render(self, eng):
        self.running.set(len(eng.running))
        self.waiting.set(len(eng.waiting))
        self.usage.set(eng.used() / eng.a.kv_tokens)
        if self.sglang:
            self.used.set(eng.used())
            self.hit.set(eng.hit_rate)
        return generate_latest(self.reg)


# -------------------------------------------------------------------- HTTP
class BadRequest(Exception):
    pass


class Server:
    def __init__(self, a):
        self.a = a
        self.metrics = Metrics(a)
        self.engine = Engine(a, self.metrics)
        self.vllm = a.flavor == "vllm"

    def error(self, msg, code=400):
        if self.vllm:
            body = {"error": {"message": msg, "type": "BadRequestError", "param": None, "code": code}}
        else:
            body = {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": code}
        return web.json_response(body, status=code)

    def parse(self, raw, chat):
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"Invalid JSON body: {e}")
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        if body.get("n", 1) not in (1, None):
            raise BadRequest("Only n=1 is supported.")
        keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
        mt = next((body[k] for k in keys if body.get(k) is not None), 128)
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise BadRequest("max_tokens must be a positive integer.")
        try:
            if chat:
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs:
                    raise BadRequest("'messages' must be a non-empty list.")
                ids = tokenize(render_chat(msgs))
            else:
                p = body.get("prompt")
                if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
                    p = p[0]
                if isinstance(p, str):
                    ids = tokenize(p)
                elif isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
                    ids = p
                else:
                    raise BadRequest("'prompt' must be a string (or a list with one string, or token ids).")
        except ValueError as e:
            raise BadRequest(str(e))
        so = body.get("stream_options")
        usage = isinstance(so, dict) and bool(so.get("include_usage"))
        model = body.get("model") if isinstance(body.get("model"), str) else self.a.model
        return ids, mt, bool(body.get("stream", False)), usage, model

    def usage(self, r):
        u = {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.out),
             "total_tokens": len(r.prompt) + len(r.out)}
        if not self.a.no_cached_report:
            u["prompt_tokens_details"] = {"cached_tokens": r.cached or 0}
        return u

    async def handle(self, request, chat):
        try:
            ids, max_new, stream, inc_usage, model = self.parse(await request.read(), chat)
            r = self.engine.submit(ids, max_new, stream)
        except (BadRequest, ValueError) as e:
            return self.error(str(e))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        words = lambda: [VOCAB[i] for i in r.out]
        try:
            if not stream:
                while not r.finished:
                    await r.ev.wait()
                    r.ev.clear()
                w = words()
                text = " ".join(w) if chat else "".join(" " + x for x in w)
                extra = {} if self.vllm else {"matched_stop": None}
                if chat:
                    choice = {"index": 0, "message": {"role": "assistant", "content": text},
                              "logprobs": None, "finish_reason": "length", **extra}
                else:
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", **extra}
                return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                          "created": created, "model": model, "choices": [choice],
                                          "usage": self.usage(r)})
            try:
                return await self.stream(request, r, chat, rid, created, model, inc_usage)
            except ConnectionError:   # client went away: abort (finally) quietly
                return web.Response(status=499)
        finally:
            self.engine.abort(r)   # no-op once finished

    async def stream(self, request, r, chat, rid, created, model, inc_usage):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = json.dumps({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": created, "model": model})[:-1]
        if chat:
            pre = 'data: ' + head + ', "choices": [{"index": 0, "delta": {"content": "'
            mid = '"}, "logprobs": null, "finish_reason": '
            role = ('data: ' + head + ', "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, '
                    '"logprobs": null, "finish_reason": null}]}\n\n')
            if self.vllm:
                await resp.write(role.encode())
        else:
            pre = 'data: ' + head + ', "choices": [{"index": 0, "text": "'
            mid = '", "logprobs": null, "finish_reason": '
        sent = 0
        while True:
            await r.ev.wait()
            r.ev.clear()
            buf = []
            n = len(r.out)
            for k in range(sent, n):
                if k == 0 and chat and not self.vllm:
                    buf.append(role)
                word = VOCAB[r.out[k]]
                text = word if (chat and k == 0) else " " + word
                fin = '"length"' if k == r.max_new - 1 else "null"
                buf.append(f"{pre}{text}{mid}{fin}}}]}}\n\n")
            sent = n
            if r.finished:
                if inc_usage:
                    buf.append("data: " + head + ', "choices": [], "usage": ' + json.dumps(self.usage(r)) + "}\n\n")
                buf.append("data: [DONE]\n\n")
                await resp.write("".join(buf).encode())
                break
            if buf:
                await resp.write("".join(buf).encode())
        await resp.write_eof()
        return resp

    async def health(self, request):
        return web.Response(status=200, text="")

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{
            "id": self.a.model, "object": "model", "created": int(time.time()),
            "owned_by": "vllm" if self.vllm else "sglang", "root": self.a.model,
            "max_model_len": self.a.kv_tokens}]})

    async def metrics_h(self, request):
        return web.Response(body=self.metrics.render(self.engine), headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self):
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", lambda req: self.handle(req, False))
        app.router.add_post("/v1/chat/completions", lambda req: self.handle(req, True))
        app.router.add_get("/v1/models", self.models)
        if not self.a.no_health:   # SGLang and vLLM both answer 200 with an empty body
            app.router.add_get("/health", self.health)
        if not self.a.no_metrics:
            app.router.add_get("/metrics", self.metrics_h)
        return app


async def serve(a):
    srv = Server(a)
    runner = web.AppRunner(srv.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a.port).start()
    task = asyncio.create_task(srv.engine.loop())
    stop = asyncio.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(s, stop.set)
    log.warning("replica (%s, %s) listening on 127.0.0.1:%d", a.flavor, a.schedule, a.port)
    await stop.wait()
    task.cancel()
    await runner.cleanup()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="foreign-model")
    p.add_argument("--flavor", choices=["vllm", "sglang"], default="sglang")
    p.add_argument("--schedule", choices=["prefill-first", "decode-first"], default="prefill-first")
    for flag, typ, default in (("--page-size", int, 1), ("--kv-tokens", int, 65536), ("--chunk", int, 8192),
                               ("--decode-ms", float, 15.0), ("--prefill-tps", float, 10000.0),
                               ("--max-running", int, 256), ("--seed", int, None),
                               ("--decode-per-seq-ms", float, 0.05), ("--decode-per-kv-token-us", float, 0.02)):
        p.add_argument(flag, type=typ, default=default)
    for flag in ("--no-health", "--no-metrics", "--no-cached-report"):
        p.add_argument(flag, action="store_true")
    a = p.parse_args(argv)
    if min(a.page_size, a.kv_tokens, a.chunk, a.max_running) < 1 or a.prefill_tps <= 0:
        p.error("sizes and rates must be positive")
    return a


def main():
    a = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
    except ImportError:
        uvloop = None
    (uvloop.run if uvloop else asyncio.run)(serve(a))


if __name__ == "__main__":
    main()
