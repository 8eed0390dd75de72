#!/usr/bin/env python3
# ruff: noqa
# Kept as its author wrote it (benchmarks/foreign_fleet.py says who and why): the lint rules
# are ours, not its author's.
"""
foreign_replica_d.py - an independent, single-file Python re-implementation of the
externally visible behaviour of **llm-d-inference-sim** (github.com/llm-d/llm-d-inference-sim,
the Go vLLM simulator) running with the KV cache enabled and the ``per-token`` latency
calculator.  Standard library + aiohttp only.

    python foreign_replica_d.py --port 8000 --model my-model [options]

Written from the simulator's public documentation and Go source (read, not copied).
Paths below are relative to the simulator repository.

FLAGS (defaults as in the simulator unless noted)
  --host 127.0.0.1 (replica only)  --port 8000  --model (required, or $SIM_MODEL)
  --served-model-name A [B ...]  --max-num-seqs 5  --max-waiting-queue-length 1000
  --max-model-len 1024  --mode random|echo  --seed <now ns>
  --latency-calculator per-token (THIS REPLICA'S DEFAULT; simulator default "") | constant | ""
  --time-to-first-token, --time-to-first-token-std-dev, --inter-token-latency,
  --inter-token-latency-std-dev, --prefill-overhead, --prefill-time-per-token,
  --prefill-time-std-dev, --kv-cache-transfer-latency, --kv-cache-transfer-latency-std-dev,
  --kv-cache-transfer-time-per-token, --kv-cache-transfer-time-std-dev   (durations, default 0)
  --time-factor-under-load 1.0
  --enable-kvcache (THIS REPLICA'S DEFAULT: true; use --enable-kvcache=false to disable)
  --kv-cache-size 1024  --block-size 16  --kv-cache-dtype auto  --hash-seed $PYTHONHASHSEED
  --global-cache-hit-threshold 0  --enable-request-id-headers false  --startup-duration 0
  --max-request-body-size-mb 4

WHAT IS MODELLED (and where the behaviour comes from)
-----------------------------------------------------
* CLI flags named as the simulator names them (pflag style: ``--flag value`` or ``--flag=value``,
  booleans as ``--flag`` / ``--flag=false``).  Durations accept Go duration strings
  ("10ms", "50us", "1.5s", "1m") and, as the simulator does, a plain integer meaning
  milliseconds.  [docs/configuration.md; pkg/common (Duration.Set/parseDuration)]
* Request admission exactly in the simulator's order [pkg/communication/http.go handleHTTP,
  pkg/simulator/simulator.go HandleRequest]: JSON parse (400) -> X-Return-Error header ->
  X-Cache-Threshold-Finish-Reason header -> model check (404 "The model `X` does not exist.")
  -> request validation (400) -> split into sub-requests (n choices / prompt arrays) ->
  enqueue.
* Worker pool [pkg/simulator/simulator.go, worker.go]: ``--max-num-seqs`` workers; a request
  that finds a free worker runs at once, otherwise it goes to a FIFO waiting queue of at most
  ``--max-waiting-queue-length`` (beyond that: 429 "Failed to enqueue request, waiting requests
  queue is full").  A finishing worker takes the head of the queue.  A worker is busy from the
  moment it takes the request until the whole (simulated) generation is over, independently of
  how fast the client reads the stream.
* Per-request processing inside the worker [pkg/endpoint/request.go HandleRequest,
  pkg/simulator/simulator.go simulateResponseProcessing]: running-count +1 -> tokenize ->
  context-window validation (400, happens *after* queueing, as in the simulator) -> KV-cache
  lookup+store ("OnRequestStart") -> cache_hit_threshold check -> response tokens -> TTFT sleep
  -> first token -> (n-1) inter-token sleeps -> metrics -> KV-cache release ("OnRequestEnd")
  -> running-count -1 -> worker takes the next waiting request.
* Latency calculators [pkg/simulator/latencies.go, docs/latency-simulation.md]:
  - per-token: TTFT = prefill-overhead*f + (prompt - cached) * prefill-time-per-token*f,
    jittered with prefill-time-std-dev; P/D decode (kv_transfer_params.do_remote_prefill):
    prompt * kv-cache-transfer-time-per-token (not load-scaled).
  - constant: TTFT = time-to-first-token*f (std-dev time-to-first-token-std-dev); P/D:
    kv-cache-transfer-latency.
  - "" (legacy default): constant form if time-to-first-token or its std-dev is non-zero,
    per-token form otherwise (same rule for KV transfer).
  - ITL = inter-token-latency*f with inter-token-latency-std-dev, for every token but the first.
  - load factor f = 1 + (time-factor-under-load - 1) * (running - 1) / (max-num-seqs - 1)
    (forced to 1 when max-num-seqs <= 1), where ``running`` is the number of requests running
    at the moment the delay is computed (TTFT once, ITL before every token).
  - Every sampled delay goes through the simulator's RandomNormDuration: mean and std-dev are
    truncated to WHOLE MILLISECONDS, the normal sample is clamped to [0.3, 1.7] x mean and the
    result is truncated to whole ms (so e.g. a 500us inter-token latency becomes 0).
    [pkg/common Random.RandomNormDuration; docs/latency-profiles.md mentions the truncation]
* Simulated tokenizer [pkg/tokenizer/tokenizer.go]: the simulator's regex
  ``({|}|:|,|-|.|?|!|;|@|#|$|%|^|&|*|(|)|+|-|_|~|/|\\|>|<|[|]|=|"|'|\\w+)(\\s*)`` (RE2, ASCII
  \\w and \\s), each match (including trailing whitespace) is one token, id = FNV-1a 32-bit of
  its UTF-8 bytes.  Chat requests are rendered as the concatenation over messages of
  ``"### " + role[(tool_call_id)] + ": " + content + "\\n"`` (structured content: text parts,
  "image: URL", ... joined by "\\n"; assistant tool calls appended as "[name(args)]"), then
  tokenized - so a later turn of a conversation shares a token prefix with the earlier turn.
  Text completions accept a string, a list of strings, a list of token ids or a list of lists.
* KV cache [pkg/kvcache/kv_cache.go, block_cache.go, docs/kv-cache.md]: the prompt's FULL
  blocks of ``--block-size`` tokens (a trailing partial block is ignored) are turned into
  chained block hashes (parent hash + tokens + model name, + cache_salt on the first block).
  At request start (in the worker, i.e. after queueing): cached_tokens = (number of leading
  blocks already present, used or unused) * block-size; capacity check
  (used + new + revived > kv-cache-size -> 500 "the kv cache does not have sufficient capacity
  to store this request"); present blocks get pinned (ref-count), unused ones are revived,
  new ones are stored, evicting the least-recently-released *unused* block whenever the cache
  is full.  At request end every block's ref-count drops; at zero the block becomes "unused"
  (evictable) with the release time.  kv_cache_usage_perc = pinned blocks / kv-cache-size,
  updated at every start and end.  prefix_cache_queries_total += prompt tokens,
  prefix_cache_hits_total += cached tokens, per request.  Only TTFT is reduced by cached tokens
  (per-token / legacy calculators).  usage.prompt_tokens_details.cached_tokens is always
  present (0 when the cache is disabled).  cache_hit_threshold / --global-cache-hit-threshold /
  X-Cache-Threshold-Finish-Reason give an immediate empty answer with finish_reason
  "cache_threshold" (usage without prompt_tokens_details, i.e. null).
* Response length [pkg/dataset/dataset.go, histogram_helper.go, docs/response_generation.md]:
  random mode picks sentences from the simulator's 11 preset sentences; length:
  ignore_eos -> max; max_tokens/max_completion_tokens given -> the 6-bucket histogram
  (20/30/20/5/10/15 %, last bucket = exactly max, bucket 4 stretches when the range > 101),
  capped by max-model-len - prompt; no max -> Gaussian(40, 20) rejection-sampled into
  [min, max-model-len - prompt] (uniform when that max < 20).  finish_reason "length" iff the
  length equals the cap, else "stop".  min_tokens (chat) raises the lower bound.
  Echo mode returns the last message's content (chat, without role) or the prompt (text);
  finish "length" iff len >= max_tokens; rejected (400) when the prompt is longer than
  max_tokens or 2*prompt > max-model-len.  Random mode rejects prompt + 1 > max-model-len.
* Wire shapes [pkg/api/response.go, pkg/communication/response_builder.go, http.go]:
  Go-struct field order, compact JSON, Go's HTML escaping of < > & in strings.
  chat: {"id":"chatcmpl-<id>","model","object":"chat.completion","created","usage",
  "choices":[{"index","finish_reason","message":{"role":"assistant","content"}}]}.
  text: id "cmpl-<id>-<promptIndex>", object "text_completion", choices[].text.
  SSE ("data: <json>\\n\\n"): HTTP headers are only sent once the first event is available
  (i.e. after TTFT), so worker-side errors keep their real status; chat sends a role chunk
  {"delta":{"role":"assistant"}} right before the first token of each choice; one chunk per
  token ("usage":null in every chunk); then one finish chunk per choice with an empty delta /
  empty text (not sent for cache_threshold); then, if stream_options.include_usage, a usage
  chunk with "choices":[]; then "data: [DONE]".  Non-streamed do_remote_decode answers use
  finish_reason "remote_decode" and carry the simulator's dummy kv_transfer_params.
* Errors [pkg/api/response.go NewError/ErrorCodeToType, http.go sendError]:
  {"error":{"message","type","param":null,"code"}} with type BadRequestError (400),
  NotFoundError (404), RateLimitError (429), InternalServerError (>=500), ... and the HTTP
  status = code.
* Endpoints: POST /v1/chat/completions, /v1/completions, /v1/chat/completions/render,
  /v1/completions/render, /tokenize; GET /v1/models, /health, /health/ready (and /ready),
  /metrics.
* /metrics in Prometheus text format 0.0.4 as client_golang writes it (families sorted by
  name, labels sorted, Go float formatting, histograms/counters appear after their first
  observation, no go_* process metrics) with the simulator's vLLM metrics
  [pkg/engine/vllm/metrics.go, pkg/simulator/metrics.go, docs/metrics.md]:
  gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc
  {model_name}, vllm:cache_config_info{block_size,cache_dtype,num_cpu_blocks="0",
  num_gpu_blocks}=1, vllm:lora_requests_info{max_lora,running_lora_adapters,
  waiting_lora_adapters}=<unix time>; histograms {model_name} vllm:time_to_first_token_seconds,
  vllm:time_per_output_token_seconds, vllm:inter_token_latency_seconds,
  vllm:request_time_per_output_token_seconds, vllm:e2e_request_latency_seconds,
  vllm:request_queue_time_seconds, vllm:request_inference_time_seconds,
  vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds,
  vllm:request_prompt_tokens, vllm:request_generation_tokens,
  vllm:max_num_generation_tokens, vllm:request_params_max_tokens (1-2-5 buckets up to
  max-model-len); counters vllm:prompt_tokens_total, vllm:generation_tokens_total,
  vllm:request_success_total{model_name,finish_reason}, vllm:prefix_cache_hits_total,
  vllm:prefix_cache_queries_total.  model_name is the first --served-model-name (or --model).
* Request ids: UUIDv5(NAMESPACE_URL, "<seed>-<port>-<counter>") exactly like the simulator's
  Random.GenerateUUIDString, or X-Request-Id with --enable-request-id-headers.  POD_NAME /
  POD_NAMESPACE env vars add x-inference-pod / x-inference-port / x-inference-namespace.

GUESSES AND SIMPLIFICATIONS (places where this replica may differ from the Go binary)
-------------------------------------------------------------------------------------
 1. Random numbers: Python's Mersenne Twister is used instead of Go's math/rand, so with the
    same --seed the response lengths/texts and jitter differ from the Go binary (request ids
    do match, see above).  Default seed = current time in ns, as documented.
 2. Block hashes are my own chained SHA-256 (64-bit) instead of llm-d-kv-cache's
    ChunkedTokenDatabase hashing; they are never exposed (no ZMQ), so only the prefix/equality
    semantics matter.  --hash-seed only perturbs the root hash.
 3. Eviction tie-break: the simulator stamps all blocks released by one request with the same
    time and picks among equal times in Go map order (i.e. randomly).  Here ties are broken by
    evicting that request's blocks tail-first (deepest block first).  Across requests it is
    least-recently-released first, as in the simulator.
 4. No ZMQ KV-events publishing, no replay endpoint, POD_IP is not required.
 5. The simulator's n>1 chat sub-requests share one request id and would collide in its block
    cache ("request already exists" -> 500); here each sub-request gets its own internal
    cache key, so n>1 works.  Multi-choice streaming quirks are kept (finish chunks carry the
    finish_reason of the first choice that produced output, ids come from it).
 6. vllm:request_queue_time_seconds is observed only for requests that actually waited in the
    queue (as in pkg/simulator/simulator.go dequeue()); directly dispatched requests do not
    observe it.
 7. vllm:time_to_first_token_seconds and vllm:request_prefill_time_seconds both observe the
    measured duration of the TTFT sleep (queue time is NOT included, as in the simulator).
    vllm:request_time_per_output_token_seconds = decode time / number of inter-token gaps,
    observed only when there is at least one gap.  e2e latency is measured from admission
    (includes queueing); failed requests still observe e2e and inference time.
 8. Tool calling (tools / tool_choice), logprobs, LoRA adapters (load/unload endpoints,
    --lora-modules), datasets, failure injection (--failure-injection-rate), fake metrics,
    sleep mode, /v1/responses, /v1/messages, /v1/embeddings, /inference/v1/generate, gRPC,
    TLS, data-parallel ranks, strict validation and /admin/config are NOT modelled (flags
    for some of them are accepted and ignored with a warning).  Requests carrying tools get a
    normal text answer.
 9. JSON type errors in request bodies produce a 400 whose message imitates, but is not
    byte-identical to, Go's encoding/json error text.
10. Client disconnects do not cancel the simulated generation (the worker keeps running, as
    in the simulator); unknown routes give aiohttp's plain 404/405 bodies instead of
    fasthttprouter's.
11. /ready is served as an alias of /health/ready (older simulator versions had /ready).
    --startup-duration makes both return 503 for that long after start.
12. Metrics are updated synchronously (the simulator updates them through buffered channels,
    so it may lag by microseconds); /metrics content type
    "text/plain; version=0.0.4; charset=utf-8".
13. Unknown CLI flags are ignored with a warning instead of aborting, so harnesses that pass
    simulator-only flags (zmq-endpoint, etc.) keep working.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import math
import os
import random
import re
import struct
import sys
import time
import uuid
from decimal import Decimal
from typing import Any, Optional

from aiohttp import web

# --------------------------------------------------------------------------------------
# constants taken from the simulator
# --------------------------------------------------------------------------------------

STOP = "stop"
LENGTH = "length"
TOOLS = "tool_calls"
REMOTE_DECODE = "remote_decode"
CACHE_THRESHOLD = "cache_threshold"

# pkg/dataset/dataset.go completionFakeResponses
FAKE_RESPONSES = [
    "Testing@, #testing 1$ ,2%,3^, [4&*5], 6~, 7-_ + (8 : 9) / \\ < > . ",
    "Testing, testing 1,2,3. ",
    "I am fine, how are you today? ",
    "I am your AI assistant, how can I help you today? ",
    "Today is a nice sunny day. ",
    "The temperature here is twenty-five degrees centigrade. ",
    "Today it is partially cloudy and raining. ",
    "To be or not to be that is the question. ",
    "Alas, poor Yorick! I knew him, Horatio: A fellow of infinite jest ",
    "The rest is silence. ",
    "Give a man a fish and you feed him for a day; teach a man to fish and you feed him for a lifetime ",
]

RESPONSE_LEN_MEAN = 40
RESPONSE_LEN_STDDEV = 20
RESP_LEN_BUCKET_PROBS = [0.2, 0.3, 0.2, 0.05, 0.1, 0.15]
FLEX_BUCKET_INDEX = 3
MAX_FIXED_BUCKET_SIZE = 20

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]

INVALID_MAX_TOKENS_MSG = "Max completion tokens and max tokens should be positive"
KV_CAPACITY_ERROR = "the kv cache does not have sufficient capacity to store this request"

NS_PER_MS = 1_000_000


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------

def go_json(obj: Any) -> bytes:
    """Compact JSON, escaped the way Go's encoding/json escapes strings (HTML-safe)."""
    s = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    # these characters can only occur inside JSON strings, so a global replace is safe
    s = (s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
         .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))
    return s.encode("utf-8")


def go_float(x: float) -> str:
    """Format a float the way Prometheus' Go expfmt does (strconv 'g', shortest)."""
    if x != x:
        return "NaN"
    if x == math.inf:
        return "+Inf"
    if x == -math.inf:
        return "-Inf"
    if x == 0:
        return "0"
    if x == 1:
        return "1"
    if x == -1:
        return "-1"
    neg = x < 0
    d = Decimal(repr(abs(float(x)))).normalize()
    _, digits_t, exp = d.as_tuple()
    digits = "".join(str(c) for c in digits_t).rstrip("0") or "0"
    nd = len(digits)
    # value = 0.digits * 10**dp
    dp = len(digits_t) + exp
    e = dp - 1
    if e < -4 or e >= 6:
        mant = digits[0]
        if nd > 1:
            mant += "." + digits[1:]
        es = "-" if e < 0 else "+"
        ae = abs(e)
        out = f"{mant}e{es}{ae:02d}"
    else:
        if dp <= 0:
            out = "0." + "0" * (-dp) + digits
        elif dp >= nd:
            out = digits + "0" * (dp - nd)
        else:
            out = digits[:dp] + "." + digits[dp:]
    return ("-" if neg else "") + out


_DUR_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
              "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_DUR_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int:
    """Go time.ParseDuration, falling back to an integer number of milliseconds (as the
    simulator's Duration.Set does).  Returns nanoseconds."""
    s = str(text).strip()
    orig = s
    try:
        return _parse_go_duration_strict(s)
    except ValueError:
        pass
    try:
        return int(s, 10) * NS_PER_MS
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration format: {orig}")


def _parse_go_duration_strict(s: str) -> int:
    if s == "":
        raise ValueError("empty")
    sign = 1
    if s[0] in "+-":
        if s[0] == "-":
            sign = -1
        s = s[1:]
    if s == "0":
        return 0
    if s == "":
        raise ValueError("empty")
    pos = 0
    total = 0.0
    while pos < len(s):
        m = _DUR_PART.match(s, pos)
        if not m or m.group(1) in ("", "."):
            raise ValueError("bad duration")
        total += float(m.group(1)) * _DUR_UNITS[m.group(2)]
        pos = m.end()
    return sign * int(round(total))


def str2bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "t", "true", "yes", "y", "on"):
        return True
    if s in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {v!r}")


def go_round(x: float) -> int:
    """math.Round (half away from zero)."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def error_type(code: int) -> str:
    # pkg/api/response.go ErrorCodeToType
    return {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
            404: "NotFoundError", 422: "UnprocessableEntityError",
            429: "RateLimitError"}.get(code, "InternalServerError" if code >= 500 else "APIConnectionError")


class ApiError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.message = message
        self.code = code

    def payload(self) -> dict:
        err = {"message": self.message, "type": error_type(self.code), "param": None}
        if self.code != 0:  # `code,omitempty`
            err["code"] = self.code
        return {"error": err}


# --------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------

IGNORED_FLAGS_WITH_VALUE = {
    "config", "lora-modules", "max-loras", "max-cpu-loras", "tokenizers-cache-dir", "zmq-endpoint",
    "zmq-topic", "zmq-max-connect-attempts", "event-batch-size", "kv-events-replay-endpoint",
    "kv-events-replay-queue-size", "failure-injection-rate", "failure-types", "fake-metrics",
    "fake-metrics-refresh-interval", "data-parallel-size", "data-parallel-rank", "dataset-path",
    "dataset-url", "dataset-table-name", "render-url", "render-timeout", "mm-render-timeout",
    "ssl-certfile", "ssl-keyfile", "max-tool-call-integer-param", "min-tool-call-integer-param",
    "max-tool-call-number-param", "min-tool-call-number-param", "max-tool-call-array-param-length",
    "min-tool-call-array-param-length", "tool-call-not-required-param-probability",
    "object-tool-call-not-required-field-probability", "tool-call-extra-call-probability",
    "default-embedding-dimensions", "image-emission-rate", "time-to-generate-image",
    "time-to-generate-image-std-dev", "v", "tensor-parallel-size", "mm-processor-kwargs",
    "ec-transfer-config", "engine",
}


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Python replica of llm-d-inference-sim (KV cache + per-token latency).",
        allow_abbrev=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=os.environ.get("SIM_MODEL", ""))
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--max-num-seqs", type=int, default=5)
    p.add_argument("--max-waiting-queue-length", type=int, default=1000)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--mode", default="random")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--latency-calculator", default="per-token")
    dur = parse_go_duration
    p.add_argument("--time-to-first-token", type=dur, default=0)
    p.add_argument("--time-to-first-token-std-dev", type=dur, default=0)
    p.add_argument("--inter-token-latency", type=dur, default=0)
    p.add_argument("--inter-token-latency-std-dev", type=dur, default=0)
    p.add_argument("--prefill-overhead", type=dur, default=0)
    p.add_argument("--prefill-time-per-token", type=dur, default=0)
    p.add_argument("--prefill-time-std-dev", type=dur, default=0)
    p.add_argument("--kv-cache-transfer-latency", type=dur, default=0)
    p.add_argument("--kv-cache-transfer-latency-std-dev", type=dur, default=0)
    p.add_argument("--kv-cache-transfer-time-per-token", type=dur, default=0)
    p.add_argument("--kv-cache-transfer-time-std-dev", type=dur, default=0)
    p.add_argument("--time-factor-under-load", type=float, default=1.0)
    p.add_argument("--enable-kvcache", type=str2bool, nargs="?", const=True, default=True)
    p.add_argument("--kv-cache-size", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--hash-seed", default=os.environ.get("PYTHONHASHSEED", ""))
    p.add_argument("--global-cache-hit-threshold", type=float, default=0.0)
    p.add_argument("--enable-request-id-headers", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--startup-duration", type=dur, default=0)
    p.add_argument("--max-request-body-size-mb", type=int, default=4)
    return p


def parse_config(argv: list[str]) -> argparse.Namespace:
    parser = build_arg_parser()
    # strip simulator flags this replica does not model (warn, keep going)
    cleaned: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            name = a[2:].split("=", 1)[0]
            if name in IGNORED_FLAGS_WITH_VALUE:
                print(f"warning: flag --{name} is not modelled by this replica, ignored", file=sys.stderr)
                if "=" not in a:
                    i += 1
                    while i < len(argv) and not argv[i].startswith("--"):
                        i += 1
                    continue
                i += 1
                continue
        cleaned.append(a)
        i += 1
    cfg, unknown = parser.parse_known_args(cleaned)
    for u in unknown:
        print(f"warning: unknown argument {u!r} ignored", file=sys.stderr)
    validate_config(cfg)
    return cfg


def validate_config(c: argparse.Namespace) -> None:
    def fail(msg: str) -> None:
        print(f"configuration error: {msg}", file=sys.stderr)
        sys.exit(1)

    if not c.model:
        fail("model parameter is empty")
    if not c.served_model_name:
        c.served_model_name = [c.model]
    if c.mode not in ("random", "echo"):
        fail(f"invalid mode '{c.mode}', valid values are 'random' and 'echo'")
    if c.latency_calculator not in ("", "constant", "per-token"):
        fail(f"invalid latency calculator '{c.latency_calculator}', valid values are 'constant' and 'per-token'")
    if c.port <= 0:
        fail(f"invalid port '{c.port}'")
    for name in ("time_to_first_token", "time_to_first_token_std_dev", "inter_token_latency",
                 "inter_token_latency_std_dev", "prefill_overhead", "prefill_time_per_token",
                 "prefill_time_std_dev", "kv_cache_transfer_latency", "kv_cache_transfer_latency_std_dev",
                 "kv_cache_transfer_time_per_token", "kv_cache_transfer_time_std_dev"):
        if getattr(c, name) < 0:
            fail(f"{name.replace('_', '-')} cannot be negative")
    if c.inter_token_latency_std_dev > 0.3 * c.inter_token_latency:
        fail("inter token latency standard deviation cannot be more than 30% of inter token latency")
    if c.time_to_first_token_std_dev > 0.3 * c.time_to_first_token:
        fail("time to first token standard deviation cannot be more than 30% of time to first token")
    if c.kv_cache_transfer_latency_std_dev > 0.3 * c.kv_cache_transfer_latency:
        fail("kv-cache tranfer standard deviation cannot be more than 30% of kv-cache tranfer")
    if c.time_factor_under_load < 1.0:
        fail("time factor under load cannot be less than 1.0")
    if c.max_model_len < 1:
        fail("max model len cannot be less than 1")
    if c.max_num_seqs < 1:
        fail("max num seqs cannot be less than 1")
    if c.max_waiting_queue_length < 0:
        fail("max waiting queue length cannot be negative")
    if c.block_size not in (8, 16, 32, 64, 128):
        fail("token block size should be one of the following: 8, 16, 32, 64, 128")
    if c.kv_cache_size < 0:
        fail("KV cache size cannot be negative")
    if not (0.0 <= c.global_cache_hit_threshold <= 1.0):
        fail("global cache hit threshold must be between 0 and 1")
    if c.seed is None:
        c.seed = time.time_ns()


# --------------------------------------------------------------------------------------
# random source (mirrors pkg/common Random API, not Go's generator)
# --------------------------------------------------------------------------------------

class SimRandom:
    def __init__(self, seed: int, port: int):
        self.rng = random.Random(seed)
        self.uuid_name = f"{seed}-{port}"
        self.uuid_count = 0

    def randint(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def randfloat(self, lo: float, hi: float) -> float:
        return self.rng.random() * (hi - lo) + lo

    def norm(self, mean: float, std: float) -> float:
        if std == 0:
            return float(mean)
        return self.rng.gauss(mean, std)

    def norm_duration_ms(self, mean_ns: int, std_ns: int) -> int:
        """Random.RandomNormDuration: whole-millisecond arithmetic, clamp to [0.3, 1.7]*mean."""
        mean_ms = int(mean_ns / NS_PER_MS)  # time.Duration.Milliseconds() truncates
        std_ms = int(std_ns / NS_PER_MS)
        value = self.norm(mean_ms, std_ms)
        if value < 0.3 * mean_ms:
            value = 0.3 * mean_ms
        elif value > 1.7 * mean_ms:
            value = 1.7 * mean_ms
        return int(value)  # Duration(value) truncates toward zero

    def uuid_string(self) -> str:
        name = f"{self.uuid_name}-{self.uuid_count}"
        self.uuid_count += 1
        return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


# --------------------------------------------------------------------------------------
# simulated tokenizer (pkg/tokenizer/tokenizer.go)
# --------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"""(\{|\}|:|,|-|\.|\?|!|;|@|#|\$|%|\^|&|\*|\(|\)|\+|-|_|~|/|\\|>|<|\[|\]|=|"|'|[0-9A-Za-z_]+)([\t\n\f\r ]*)""")


def fnv32a(s: str) -> int:
    h = 0x811C9DC5
    for b in s.encode("utf-8"):
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


class Tokenizer:
    def tokenize(self, text: str) -> tuple[list[int], list[str]]:
        strs = [m.group(0) for m in _TOKEN_RE.finditer(text)]
        return [fnv32a(s) for s in strs], strs

    @staticmethod
    def plain_text(msg: dict, include_role: bool) -> str:
        out = []
        if include_role:
            out.append(str(msg.get("role") or ""))
            tcid = msg.get("tool_call_id")
            if tcid:
                out.append("(" + str(tcid) + ")")
            out.append(": ")
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            parts = []
            for block in content:
                if not isinstance(block, dict):
                    continue
                t = block.get("type")
                if t == "text":
                    parts.append(str(block.get("text") or ""))
                elif t == "image_url" and isinstance(block.get("image_url"), dict):
                    parts.append("image: " + str(block["image_url"].get("url") or ""))
                elif t == "audio_url" and isinstance(block.get("audio_url"), dict):
                    parts.append("audio: " + str(block["audio_url"].get("url") or ""))
                elif t == "input_audio" and isinstance(block.get("input_audio"), dict):
                    parts.append("input_audio: " + str(block["input_audio"].get("format") or ""))
                elif t == "video_url" and isinstance(block.get("video_url"), dict):
                    parts.append("video: " + str(block["video_url"].get("url") or ""))
            out.append("\n".join(parts))
        for tc in msg.get("tool_calls") or []:
            fn = (tc or {}).get("function") or {}
            if fn.get("name") is not None:
                out.append("[" + str(fn.get("name")) + "(" + str(fn.get("arguments") or "") + ")]")
        return "".join(out)

    def render_messages(self, messages: list[dict]) -> tuple[list[int], list[str]]:
        text = "".join("### " + self.plain_text(m, True) + "\n" for m in messages)
        return self.tokenize(text)


# --------------------------------------------------------------------------------------
# KV block cache (pkg/kvcache/block_cache.go)
# --------------------------------------------------------------------------------------

class KVCapacityError(Exception):
    pass


class BlockCache:
    def __init__(self, max_blocks: int):
        self.max_blocks = max_blocks
        self.request_to_blocks: dict[str, list[int]] = {}
        self.used: dict[int, int] = {}  # block -> ref count
        # unused blocks in eviction order (oldest release first); see guess #3
        self.unused: "collections.OrderedDict[int, float]" = collections.OrderedDict()

    def start_request(self, req_key: str, hashes: list[int]) -> int:
        if req_key in self.request_to_blocks:
            raise KVCapacityError(f"request already exists for id {req_key}")
        cached_prefix = 0
        prefix_missed = False
        to_add, to_revive, in_use = [], [], []
        for h in hashes:
            is_unused = h in self.unused
            is_used = h in self.used
            if not prefix_missed:
                if is_unused or is_used:
                    cached_prefix += 1
                else:
                    prefix_missed = True
            if is_unused:
                to_revive.append(h)
            elif not is_used:
                to_add.append(h)
            else:
                in_use.append(h)
        if len(self.used) + len(to_add) + len(to_revive) > self.max_blocks:
            raise KVCapacityError(KV_CAPACITY_ERROR)
        for h in in_use:
            self.used[h] += 1
        for h in to_revive:
            self.used[h] = 1
            del self.unused[h]
        for h in to_add:
            if len(self.used) + len(self.unused) == self.max_blocks:
                self.unused.popitem(last=False)  # evict least recently released unused block
            self.used[h] = 1
        self.request_to_blocks[req_key] = list(hashes)
        return cached_prefix

    def finish_request(self, req_key: str) -> None:
        hashes = self.request_to_blocks.pop(req_key, None)
        if hashes is None:
            return
        now = time.monotonic()
        # tail-first so that, among blocks released together, the deepest is evicted first
        for h in reversed(hashes):
            ref = self.used.get(h)
            if ref is None:
                continue
            if ref > 1:
                self.used[h] = ref - 1
            else:
                del self.used[h]
                self.unused[h] = now
                self.unused.move_to_end(h)

    def usage(self) -> float:
        if self.max_blocks == 0:
            return math.nan
        return len(self.used) / self.max_blocks


class KVCacheHelper:
    def __init__(self, cfg: argparse.Namespace):
        self.block_size = cfg.block_size
        self.cache = BlockCache(cfg.kv_cache_size)
        seed = cfg.hash_seed or ""
        self.root = int.from_bytes(hashlib.sha256(("root:" + seed).encode()).digest()[:8], "big")

    def block_hashes(self, tokens: list[int], model: str, salt: Optional[str]) -> list[int]:
        bs = self.block_size
        parent = self.root
        out = []
        for i in range(len(tokens) // bs):
            chunk = tokens[i * bs:(i + 1) * bs]
            h = hashlib.sha256()
            h.update(parent.to_bytes(8, "big"))
            h.update(struct.pack(f"<{bs}I", *[t & 0xFFFFFFFF for t in chunk]))
            h.update(b"\x00" + model.encode("utf-8"))
            if i == 0 and salt:
                h.update(b"\x01" + salt.encode("utf-8"))
            parent = int.from_bytes(h.digest()[:8], "big")
            out.append(parent)
        return out

    def on_request_start(self, req_key: str, tokens: list[int], model: str, salt: Optional[str]) -> tuple[int, int]:
        hashes = self.block_hashes(tokens, model, salt)
        n = self.cache.start_request(req_key, hashes)
        return len(tokens), n * self.block_size

    def on_request_end(self, req_key: str) -> None:
        self.cache.finish_request(req_key)


# --------------------------------------------------------------------------------------
# Prometheus metrics
# --------------------------------------------------------------------------------------

def build_125_buckets(max_value: int) -> list[float]:
    if max_value <= 0:
        return []
    out = []
    exponent = 0
    while True:
        complete = True
        for m in (1, 2, 5):
            v = m * 10 ** exponent
            if v <= max_value:
                out.append(float(v))
                complete = False
        if complete:
            break
        exponent += 1
    return out


def _escape_label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


class Family:
    def __init__(self, name: str, mtype: str, help_: str, label_names: list[str],
                 buckets: Optional[list[float]] = None):
        self.name = name
        self.type = mtype
        self.help = help_
        self.label_names = label_names
        self.buckets = buckets
        self.series: dict[tuple, Any] = {}

    def _key(self, labels: tuple) -> tuple:
        assert len(labels) == len(self.label_names)
        return tuple(str(x) for x in labels)

    def set(self, labels: tuple, value: float) -> None:
        self.series[self._key(labels)] = float(value)

    def add(self, labels: tuple, value: float) -> None:
        k = self._key(labels)
        self.series[k] = self.series.get(k, 0.0) + float(value)

    def observe(self, labels: tuple, value: float) -> None:
        k = self._key(labels)
        s = self.series.get(k)
        if s is None:
            s = {"counts": [0] * len(self.buckets), "sum": 0.0, "count": 0}
            self.series[k] = s
        for i, ub in enumerate(self.buckets):
            if value <= ub:
                s["counts"][i] += 1
        s["sum"] += float(value)
        s["count"] += 1

    def render(self) -> list[str]:
        if not self.series:
            return []
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.type}"]
        order = sorted(range(len(self.label_names)), key=lambda i: self.label_names[i])
        for key in sorted(self.series):
            pairs = [f'{self.label_names[i]}="{_escape_label(key[i])}"' for i in order]
            val = self.series[key]
            if self.type == "histogram":
                for ub, c in zip(self.buckets, val["counts"]):
                    lab = ",".join(pairs + [f'le="{go_float(ub)}"'])
                    lines.append(f"{self.name}_bucket{{{lab}}} {go_float(c)}")
                lab = ",".join(pairs + ['le="+Inf"'])
                lines.append(f"{self.name}_bucket{{{lab}}} {go_float(val['count'])}")
                base = "{" + ",".join(pairs) + "}" if pairs else ""
                lines.append(f"{self.name}_sum{base} {go_float(val['sum'])}")
                lines.append(f"{self.name}_count{base} {go_float(val['count'])}")
            else:
                base = "{" + ",".join(pairs) + "}" if pairs else ""
                lines.append(f"{self.name}{base} {go_float(val)}")
        return lines


class Metrics:
    def __init__(self, cfg: argparse.Namespace):
        self.model = cfg.served_model_name[0]
        self.fams: dict[str, Family] = {}
        M = ["model_name"]
        tok_buckets = build_125_buckets(cfg.max_model_len)

        def fam(name, t, h, labels=M, buckets=None):
            self.fams[name] = Family(name, t, h, labels, buckets)

        fam("vllm:num_requests_running", "gauge", "Number of requests currently running on GPU.")
        fam("vllm:num_requests_waiting", "gauge", "Prometheus metric for the number of queued requests.")
        fam("vllm:kv_cache_usage_perc", "gauge",
            "Prometheus metric for the fraction of KV-cache blocks currently in use (from 0 to 1).")
        fam("vllm:lora_requests_info", "gauge", "Running stats on lora requests.",
            ["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        fam("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.",
            ["block_size", "cache_dtype", "num_cpu_blocks", "num_gpu_blocks"])
        fam("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
            buckets=TTFT_BUCKETS)
        fam("vllm:time_per_output_token_seconds", "histogram", "Histogram of time per output token in seconds.",
            buckets=TPOT_BUCKETS)
        fam("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
            buckets=TPOT_BUCKETS)
        fam("vllm:request_time_per_output_token_seconds", "histogram",
            "Histogram of time_per_output_token_seconds per request.", buckets=TPOT_BUCKETS)
        fam("vllm:e2e_request_latency_seconds", "histogram", "Histogram of end to end request latency in seconds.",
            buckets=REQUEST_LATENCY_BUCKETS)
        fam("vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS)
        fam("vllm:request_inference_time_seconds", "histogram",
            "Histogram of time spent in RUNNING phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
        fam("vllm:request_prefill_time_seconds", "histogram",
            "Histogram of time spent in PREFILL phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
        fam("vllm:request_decode_time_seconds", "histogram", "Histogram of time spent in DECODE phase for request.",
            buckets=REQUEST_LATENCY_BUCKETS)
        fam("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", buckets=tok_buckets)
        fam("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.",
            buckets=tok_buckets)
        fam("vllm:max_num_generation_tokens", "histogram",
            "Histogram of maximum number of requested generation tokens.", buckets=tok_buckets)
        fam("vllm:request_params_max_tokens", "histogram", "Histogram of the max_tokens request parameter.",
            buckets=tok_buckets)
        fam("vllm:prompt_tokens_total", "counter", "Total number of prompt tokens processed.")
        fam("vllm:generation_tokens_total", "counter", "Total number of generated tokens.")
        fam("vllm:request_success_total", "counter", "Count of successfully processed requests.",
            ["model_name", "finish_reason"])
        fam("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.")
        fam("vllm:prefix_cache_queries_total", "counter",
            "Prefix cache queries, in terms of number of queried tokens.")

        self.running = 0
        self.waiting = 0
        self.set_running(0)
        self.set_waiting(0)
        self.fams["vllm:kv_cache_usage_perc"].set((self.model,), 0)
        self.fams["vllm:cache_config_info"].set(
            (str(cfg.block_size), cfg.kv_cache_dtype, "0", str(cfg.kv_cache_size)), 1)
        self.fams["vllm:lora_requests_info"].set(("1", "", ""), float(int(time.time())))

    def set_running(self, n: int) -> None:
        self.running = n
        self.fams["vllm:num_requests_running"].set((self.model,), n)

    def set_waiting(self, n: int) -> None:
        self.waiting = n
        self.fams["vllm:num_requests_waiting"].set((self.model,), n)

    def kv_usage(self, v: float) -> None:
        self.fams["vllm:kv_cache_usage_perc"].set((self.model,), v)

    def observe(self, name: str, v: float) -> None:
        self.fams[name].observe((self.model,), v)

    def add(self, name: str, v: float) -> None:
        self.fams[name].add((self.model,), v)

    def success(self, prompt_tokens: int, gen_tokens: int, max_tokens: Optional[int], finish: str) -> None:
        self.fams["vllm:request_success_total"].add((self.model, finish), 1)
        self.observe("vllm:request_prompt_tokens", prompt_tokens)
        self.observe("vllm:request_generation_tokens", gen_tokens)
        self.add("vllm:prompt_tokens_total", prompt_tokens)
        self.add("vllm:generation_tokens_total", gen_tokens)
        if max_tokens is not None:
            self.observe("vllm:request_params_max_tokens", max_tokens)
        self.observe("vllm:max_num_generation_tokens", gen_tokens)

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted(self.fams):
            lines.extend(self.fams[name].render())
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# latency calculators (pkg/simulator/latencies.go)
# --------------------------------------------------------------------------------------

class LatencyCalculator:
    def __init__(self, cfg: argparse.Namespace, rnd: SimRandom):
        self.c = cfg
        self.rnd = rnd
        self.kind = cfg.latency_calculator

    def load_factor(self, running: int) -> float:
        if self.c.max_num_seqs <= 1:
            return 1.0
        return 1 + (self.c.time_factor_under_load - 1) * (running - 1) / (self.c.max_num_seqs - 1)

    def _per_token_prefill(self, prompt: int, cached: int, running: int) -> int:
        f = self.load_factor(running)
        overhead = int(self.c.prefill_overhead * f)
        per_tok = int(self.c.prefill_time_per_token * f)
        return self.rnd.norm_duration_ms(overhead + (prompt - cached) * per_tok, self.c.prefill_time_std_dev)

    def _constant_prefill(self, running: int) -> int:
        ttft = int(self.c.time_to_first_token * self.load_factor(running))
        return self.rnd.norm_duration_ms(ttft, self.c.time_to_first_token_std_dev)

    def ttft_ms(self, prompt: int, cached: int, remote_prefill: bool, running: int) -> int:
        c = self.c
        if self.kind == "per-token":
            if remote_prefill:
                return self.rnd.norm_duration_ms(c.kv_cache_transfer_time_per_token * prompt,
                                                 c.kv_cache_transfer_time_std_dev)
            return self._per_token_prefill(prompt, cached, running)
        if self.kind == "constant":
            if remote_prefill:
                return self.rnd.norm_duration_ms(c.kv_cache_transfer_latency, c.kv_cache_transfer_latency_std_dev)
            return self._constant_prefill(running)
        # legacy default calculator
        if remote_prefill:
            if c.kv_cache_transfer_latency == 0 and c.kv_cache_transfer_latency_std_dev == 0:
                return self.rnd.norm_duration_ms(c.kv_cache_transfer_time_per_token * prompt,
                                                 c.kv_cache_transfer_time_std_dev)
            return self.rnd.norm_duration_ms(c.kv_cache_transfer_latency, c.kv_cache_transfer_latency_std_dev)
        if c.time_to_first_token == 0 and c.time_to_first_token_std_dev == 0:
            return self._per_token_prefill(prompt, cached, running)
        return self._constant_prefill(running)

    def itl_ms(self, running: int) -> int:
        lat = int(self.c.inter_token_latency * self.load_factor(running))
        return self.rnd.norm_duration_ms(lat, self.c.inter_token_latency_std_dev)


# --------------------------------------------------------------------------------------
# response length / content (pkg/dataset)
# --------------------------------------------------------------------------------------

class Dataset:
    def __init__(self, cfg: argparse.Namespace, rnd: SimRandom, tok: Tokenizer):
        self.max_model_len = cfg.max_model_len
        self.rnd = rnd
        self.responses = [tok.tokenize(t)[1] for t in FAKE_RESPONSES]
        self.cum = []
        s = 0.0
        for p in RESP_LEN_BUCKET_PROBS:
            s += p
            self.cum.append(s)

    def _bucket_bounds(self, lo: int, hi: int, idx: int) -> tuple[int, int]:
        nb = len(self.cum)
        max_equal = MAX_FIXED_BUCKET_SIZE * (nb - 1) + 1
        range_size = hi - lo + 1
        if range_size <= max_equal or FLEX_BUCKET_INDEX < 0 or FLEX_BUCKET_INDEX >= nb - 1:
            bsz = (hi - lo) / (nb - 1)
            start = lo + int(bsz * idx)
            end = lo + int(bsz * (idx + 1)) - 1
        elif idx < FLEX_BUCKET_INDEX:
            start = lo + MAX_FIXED_BUCKET_SIZE * idx
            end = lo + MAX_FIXED_BUCKET_SIZE * (idx + 1) - 1
        else:
            flex = range_size - MAX_FIXED_BUCKET_SIZE * (nb - 2)
            if idx == FLEX_BUCKET_INDEX:
                start = lo + MAX_FIXED_BUCKET_SIZE * idx
                end = lo + MAX_FIXED_BUCKET_SIZE * idx + flex - 1
            else:
                start = lo + MAX_FIXED_BUCKET_SIZE * (idx - 1) + flex
                end = lo + MAX_FIXED_BUCKET_SIZE * idx + flex - 1
        if end >= hi:
            end = hi - 1
        return start, end

    def _histogram_len(self, lo: int, hi: int) -> int:
        if hi <= lo:
            return hi
        if hi - lo + 1 <= len(self.cum):
            return self.rnd.randint(lo, hi)
        r = self.rnd.randfloat(0, 1)
        if r > self.cum[-2]:
            return hi
        idx = len(self.cum) - 1
        for i, c in enumerate(self.cum):
            if r <= c:
                idx = i
                break
        start, end = self._bucket_bounds(lo, hi, idx)
        return self.rnd.randint(start, end)

    def _random_len(self, lo: int, hi: int) -> int:
        if lo == hi:
            return hi
        if hi < RESPONSE_LEN_MEAN - RESPONSE_LEN_STDDEV:
            return self.rnd.randint(lo, hi)
        while True:
            v = self.rnd.norm(RESPONSE_LEN_MEAN, RESPONSE_LEN_STDDEV)
            if lo <= v <= hi:
                return go_round(v)

    def random_response(self, prompt_len: int, max_tokens: Optional[int], min_tokens: Optional[int],
                        ignore_eos: bool) -> tuple[list[str], str]:
        remaining = self.max_model_len - prompt_len
        if max_tokens is not None:
            max_resp = max_tokens if max_tokens < remaining else remaining
            has_max = True
        else:
            max_resp, has_max = remaining, False
        min_resp = 1
        if min_tokens is not None and min_tokens > 1:
            min_resp = min_tokens
        if min_resp > max_resp:
            min_resp = max_resp
        if ignore_eos:
            n = max_resp
        elif has_max:
            n = self._histogram_len(min_resp, max_resp)
        else:
            n = self._random_len(min_resp, max_resp)
        finish = LENGTH if n == max_resp else STOP
        out: list[str] = []
        while len(out) < n:
            strs = self.responses[self.rnd.randint(0, len(self.responses) - 1)]
            out.extend(strs[:n - len(out)])
        return out, finish


# --------------------------------------------------------------------------------------
# request model
# --------------------------------------------------------------------------------------

def _type_err(field: str, expected: str, got: Any) -> ApiError:
    kind = type(got).__name__
    kind = {"str": "string", "int": "number", "float": "number", "bool": "bool", "list": "array",
            "dict": "object", "NoneType": "null"}.get(kind, kind)
    return ApiError(f"Failed to read and parse request body, json: cannot unmarshal {kind} into Go struct "
                    f"field .{field} of type {expected}", 400)


def _opt_int(d: dict, field: str) -> Optional[int]:
    v = d.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise _type_err(field, "int64", v)
    return int(v)


def _opt_bool(d: dict, field: str) -> bool:
    v = d.get(field)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _type_err(field, "bool", v)
    return v


class ParsedRequest:
    """Wire form of a chat or text completions request (api.ChatCompletionsRequest /
    api.TextCompletionsParsedRequest)."""

    def __init__(self, kind: str, data: dict):
        self.kind = kind
        self.data = data
        self.model = data.get("model")
        if self.model is not None and not isinstance(self.model, str):
            raise _type_err("model", "string", self.model)
        self.model = self.model or ""
        self.stream = _opt_bool(data, "stream")
        so = data.get("stream_options")
        if so is not None and not isinstance(so, dict):
            raise _type_err("stream_options", "api.StreamOptions", so)
        self.include_usage_opt = bool(so and so.get("include_usage") is True)
        self.ignore_eos = _opt_bool(data, "ignore_eos")
        self.n_raw = _opt_int(data, "n")
        kvp = data.get("kv_transfer_params")
        if kvp is not None and not isinstance(kvp, dict):
            raise _type_err("kv_transfer_params", "api.KVTransferParams", kvp)
        kvp = kvp or {}
        self.do_remote_decode = kvp.get("do_remote_decode") is True
        self.do_remote_prefill = kvp.get("do_remote_prefill") is True
        cht = data.get("cache_hit_threshold")
        if cht is not None and (isinstance(cht, bool) or not isinstance(cht, (int, float))):
            raise _type_err("cache_hit_threshold", "float64", cht)
        self.cache_hit_threshold = None if cht is None else float(cht)
        salt = data.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise _type_err("cache_salt", "string", salt)
        self.cache_salt = salt or None
        self.min_tokens: Optional[int] = None
        if kind == "chat":
            msgs = data.get("messages")
            if msgs is not None and not isinstance(msgs, list):
                raise _type_err("messages", "[]api.Message", msgs)
            self.messages = []
            for m in msgs or []:
                if not isinstance(m, dict):
                    raise _type_err("messages", "api.Message", m)
                c = m.get("content")
                if c is not None and not isinstance(c, (str, list)):
                    raise ApiError("Failed to read and parse request body, content format not supported", 400)
                self.messages.append(m)
            mct = _opt_int(data, "max_completion_tokens")
            mt = _opt_int(data, "max_tokens")
            self.max_tokens = mct if mct is not None else mt
            self.min_tokens = _opt_int(data, "min_tokens")
            self.prompts = None
        else:
            self.max_tokens = _opt_int(data, "max_tokens")
            self.prompts = self._parse_prompt(data.get("prompt"))

    @staticmethod
    def _parse_prompt(p: Any) -> list:
        if p is None:
            return []
        if isinstance(p, str):
            return [p]
        if isinstance(p, list):
            if all(isinstance(x, str) for x in p):
                return list(p)
            if all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 0xFFFFFFFF for x in p):
                return [list(p)]
            if all(isinstance(x, list) and all(isinstance(y, int) and not isinstance(y, bool)
                                               and 0 <= y <= 0xFFFFFFFF for y in x) for x in p):
                return [list(x) for x in p]
        raise ApiError("Failed to read and parse request body, prompt must be a string, an array of strings, "
                       "an array of token ids, or an array of arrays of token ids", 400)

    @property
    def n(self) -> int:
        return 1 if self.n_raw is None or self.n_raw <= 0 else self.n_raw

    @property
    def include_usage(self) -> bool:
        return (not self.stream) or self.include_usage_opt

    def validate(self) -> None:
        if self.kind == "chat":
            if not self.messages:
                raise ApiError("messages must not be empty", 400)
        else:
            if not self.prompts:
                raise ApiError("prompt array must contain at least one prompt", 400)
            for p in self.prompts:
                if isinstance(p, list):
                    if len(p) == 0:
                        raise ApiError("prompt must not contain an empty token-id array", 400)
                elif p == "":
                    raise ApiError("prompt must not contain an empty string", 400)
        # endpoint/helpers.go validateRequest
        if self.n_raw is not None and self.n_raw <= 0:
            raise ApiError("n must be at least 1", 400)
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ApiError(INVALID_MAX_TOKENS_MSG, 400)
        if self.min_tokens is not None:
            if self.min_tokens < 0:
                raise ApiError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.", 400)
            if self.max_tokens is not None and self.min_tokens > self.max_tokens:
                raise ApiError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                               f"got {self.min_tokens}.", 400)
        if self.do_remote_decode and self.stream:
            raise ApiError("Prefill does not support streaming", 400)
        if self.ignore_eos and self.max_tokens is None:
            raise ApiError("Ignore_eos is true but max_completion_tokens (or max_tokens) is not set", 400)


class SubRequest:
    """Processing form: one prompt, one choice (what a worker sees)."""

    def __init__(self, parsed: ParsedRequest, request_id: str, choice_idx: int, prompt: Any,
                 displayed_model: str, events: asyncio.Queue, cache_threshold_header: bool):
        self.p = parsed
        self.kind = parsed.kind
        self.request_id = request_id
        self.choice_idx = choice_idx
        self.prompt = prompt
        self.displayed_model = displayed_model
        self.events = events
        self.cache_threshold_header = cache_threshold_header
        self.start_processing = time.monotonic()
        self.kv_key = f"{request_id}#{choice_idx}"


class RespCtx:
    def __init__(self, sub: SubRequest, finish: str, usage: dict, send_usage: bool, strings: list[str]):
        self.request_id = sub.request_id
        self.display_model = sub.displayed_model
        self.finish_reason = finish
        self.usage = usage
        self.send_usage = send_usage
        self.do_remote_decode = sub.p.do_remote_decode
        self.strings = strings
        self.creation_time = 0


# --------------------------------------------------------------------------------------
# the simulator core
# --------------------------------------------------------------------------------------

class Simulator:
    def __init__(self, cfg: argparse.Namespace):
        self.cfg = cfg
        self.rnd = SimRandom(cfg.seed, cfg.port)
        self.tok = Tokenizer()
        self.metrics = Metrics(cfg)
        self.latency = LatencyCalculator(cfg, self.rnd)
        self.dataset = Dataset(cfg, self.rnd, self.tok)
        self.kv = KVCacheHelper(cfg) if cfg.enable_kvcache else None
        self.free_workers = cfg.max_num_seqs
        self.queue: "collections.deque[tuple[SubRequest, float]]" = collections.deque()
        self.tasks: set = set()
        self.start_time = time.monotonic()

    # ---------------- scheduling ----------------

    def submit(self, sub: SubRequest) -> None:
        if self.free_workers > 0:
            self.free_workers -= 1
            self._start(sub)
            return
        if len(self.queue) >= self.cfg.max_waiting_queue_length:
            sub.events.put_nowait(("error", sub.choice_idx,
                                   ApiError("Failed to enqueue request, waiting requests queue is full", 429)))
            sub.events.put_nowait(("done", sub.choice_idx, None))
            return
        self.queue.append((sub, time.monotonic()))
        self.metrics.set_waiting(self.metrics.waiting + 1)

    def _start(self, sub: SubRequest) -> None:
        t = asyncio.get_running_loop().create_task(self._process(sub))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    def _worker_finished(self) -> None:
        if self.queue:
            sub, enq = self.queue.popleft()
            self.metrics.set_waiting(self.metrics.waiting - 1)
            self.metrics.observe("vllm:request_queue_time_seconds", time.monotonic() - enq)
            self._start(sub)
        else:
            self.free_workers += 1

    # ---------------- request processing (worker) ----------------

    def _tokenize(self, sub: SubRequest) -> tuple[list[int], list[str]]:
        if sub.kind == "chat":
            return self.tok.render_messages(sub.p.messages)
        if isinstance(sub.prompt, list):
            return list(sub.prompt), [str(t) for t in sub.prompt]
        return self.tok.tokenize(sub.prompt)

    def _echo_strings(self, sub: SubRequest, prompt_strs: list[str]) -> list[str]:
        if sub.kind == "chat":
            last = sub.p.messages[-1] if sub.p.messages else {}
            return self.tok.tokenize(Tokenizer.plain_text(last, False))[1]
        if isinstance(sub.prompt, list):
            ids = sub.prompt
            return [str(t) + ("," if i < len(ids) - 1 else "") for i, t in enumerate(ids)]
        return prompt_strs

    def _handle_request(self, sub: SubRequest) -> tuple[RespCtx, int]:
        """endpoint/request.go HandleRequest; returns the response context and cached tokens."""
        cfg = self.cfg
        tokens, strs = self._tokenize(sub)
        n_prompt = len(tokens)
        echo = cfg.mode == "echo"
        if echo:
            if not 2 * n_prompt <= cfg.max_model_len:
                raise ApiError(
                    f"This model's maximum context length is {cfg.max_model_len} tokens. However, the prompt has "
                    f"{n_prompt} tokens, and in echo mode the prompt is echoed back as the response, requiring "
                    f"{n_prompt * 2} tokens in total. Please reduce the length of the messages", 400)
            if sub.p.max_tokens is not None and n_prompt > sub.p.max_tokens:
                raise ApiError(
                    "In echo mode the full prompt is returned as the response, so max_tokens must be at least the "
                    f"prompt length. max_tokens is {sub.p.max_tokens}, but the prompt has {n_prompt} tokens. "
                    "Please increase max_tokens or reduce the length of the messages", 400)
        elif not n_prompt + 1 <= cfg.max_model_len:
            raise ApiError(
                f"This model's maximum context length is {cfg.max_model_len} tokens. However, you requested "
                f"{n_prompt} tokens in the messages. Please reduce the length of the messages", 400)

        queried, cached = 0, 0
        if self.kv is not None:
            try:
                queried, cached = self.kv.on_request_start(sub.kv_key, tokens, sub.displayed_model,
                                                           sub.p.cache_salt)
            except KVCapacityError as e:
                raise ApiError(str(e), 500)
            self.metrics.add("vllm:prefix_cache_queries_total", queried)
            self.metrics.add("vllm:prefix_cache_hits_total", cached)
            self.metrics.kv_usage(self.kv.cache.usage())
        hit_rate = cached / queried if queried > 0 else 0.0

        # cache_threshold finish reason
        threshold_hit = sub.cache_threshold_header
        if not threshold_hit and self.kv is not None:
            thr = None
            rt = sub.p.cache_hit_threshold
            if rt is not None and 0 <= rt <= 1:
                thr = rt
            elif cfg.global_cache_hit_threshold > 0:
                thr = cfg.global_cache_hit_threshold
            if thr is not None and hit_rate < thr:
                threshold_hit = True
        if threshold_hit:
            usage = {"prompt_tokens": n_prompt, "completion_tokens": 0, "total_tokens": n_prompt,
                     "prompt_tokens_details": None}
            return RespCtx(sub, CACHE_THRESHOLD, usage, sub.p.include_usage, []), cached

        if echo:
            resp = self._echo_strings(sub, strs)
            mt = sub.p.max_tokens
            finish = LENGTH if (mt is not None and len(resp) >= mt) else STOP
        else:
            resp, finish = self.dataset.random_response(n_prompt, sub.p.max_tokens, sub.p.min_tokens,
                                                        sub.p.ignore_eos)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": len(resp),
                 "total_tokens": n_prompt + len(resp), "prompt_tokens_details": {"cached_tokens": cached}}
        if not sub.p.stream and sub.p.do_remote_decode:
            finish = REMOTE_DECODE
        return RespCtx(sub, finish, usage, sub.p.include_usage, resp), cached

    async def _process(self, sub: SubRequest) -> None:
        m = self.metrics
        start = time.monotonic()
        m.set_running(m.running + 1)
        emit = sub.events.put_nowait
        try:
            try:
                ctx, cached = self._handle_request(sub)
            except ApiError as e:
                emit(("error", sub.choice_idx, e))
                return
            if ctx.finish_reason == CACHE_THRESHOLD:
                emit(("final", sub.choice_idx, ctx))
            else:
                t0 = time.monotonic()
                ttft = self.latency.ttft_ms(ctx.usage["prompt_tokens"], cached, sub.p.do_remote_prefill, m.running)
                await asyncio.sleep(ttft / 1000.0)
                prefill = time.monotonic() - t0
                m.observe("vllm:request_prefill_time_seconds", prefill)
                m.observe("vllm:time_to_first_token_seconds", prefill)
                emit(("created", sub.choice_idx, ctx))
                start_decode = time.monotonic()
                gaps = 0
                if not ctx.strings:
                    emit(("final", sub.choice_idx, ctx))
                else:
                    last = len(ctx.strings) - 1
                    for i, s in enumerate(ctx.strings):
                        if i != 0:
                            itl = self.latency.itl_ms(m.running)
                            await asyncio.sleep(itl / 1000.0)
                            m.observe("vllm:time_per_output_token_seconds", itl / 1000.0)
                            m.observe("vllm:inter_token_latency_seconds", itl / 1000.0)
                            gaps += 1
                        emit(("token", sub.choice_idx, ctx, s, i == last))
                decode = time.monotonic() - start_decode
                m.observe("vllm:request_decode_time_seconds", decode)
                if gaps > 0:
                    m.observe("vllm:request_time_per_output_token_seconds", decode / gaps)
            m.success(ctx.usage["prompt_tokens"], ctx.usage["completion_tokens"], sub.p.max_tokens,
                      ctx.finish_reason)
        finally:
            now = time.monotonic()
            m.observe("vllm:e2e_request_latency_seconds", now - sub.start_processing)
            m.observe("vllm:request_inference_time_seconds", now - start)
            m.set_running(m.running - 1)
            if self.kv is not None:
                self.kv.on_request_end(sub.kv_key)
                m.kv_usage(self.kv.cache.usage())
            emit(("done", sub.choice_idx, None))
            self._worker_finished()

    # ---------------- helpers for the HTTP layer ----------------

    def is_valid_model(self, model: str) -> bool:
        return model in self.cfg.served_model_name

    def new_request_id(self, request: web.Request) -> str:
        if self.cfg.enable_request_id_headers:
            rid = request.headers.get("X-Request-Id", "")
            if rid:
                return rid
        return self.rnd.uuid_string()


# --------------------------------------------------------------------------------------
# response builders (pkg/communication/response_builder.go)
# --------------------------------------------------------------------------------------

def aggregate_usage(ctxs: list[RespCtx]) -> dict:
    if len(ctxs) == 1:
        return ctxs[0].usage
    agg = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "prompt_tokens_details": None}
    seen = set()
    for c in ctxs:
        agg["completion_tokens"] += c.usage["completion_tokens"]
        if c.request_id not in seen:
            seen.add(c.request_id)
            agg["prompt_tokens"] += c.usage["prompt_tokens"]
            if c.usage.get("prompt_tokens_details") is not None and agg["prompt_tokens_details"] is None:
                agg["prompt_tokens_details"] = c.usage["prompt_tokens_details"]
    agg["total_tokens"] = agg["prompt_tokens"] + agg["completion_tokens"]
    return agg


DUMMY_KV_TRANSFER_PARAMS = {"do_remote_decode": False, "do_remote_prefill": True, "remote_engine_id": "DUMMY_ID",
                            "remote_block_ids": ["DUMMY_ID"], "remote_host": "DUMMY", "remote_port": 1234,
                            "tp_size": 1}


def base_response(kind_prefix: str, ctx: RespCtx, obj: str, created: int, usage: Optional[dict],
                  remote_decode: bool) -> dict:
    d = {"id": kind_prefix + ctx.request_id, "model": ctx.display_model, "object": obj}
    if remote_decode:
        d["kv_transfer_params"] = DUMMY_KV_TRANSFER_PARAMS
    d["created"] = created
    d["usage"] = usage
    return d


class ChatBuilder:
    prefix = "chatcmpl-"

    def full(self, ctxs: list[RespCtx], texts: list[str]) -> dict:
        c0 = ctxs[0]
        d = base_response(self.prefix, c0, "chat.completion", int(time.time()), aggregate_usage(ctxs),
                          c0.do_remote_decode)
        choices = []
        for i, t in enumerate(texts):
            msg = {"role": "assistant"}
            if t != "":
                msg["content"] = t
            choices.append({"index": i, "finish_reason": ctxs[i].finish_reason, "message": msg})
        d["choices"] = choices
        return d

    def chunk(self, ctx: RespCtx, text: Optional[str], role: str, finish: Optional[str], idx: int) -> dict:
        d = base_response(self.prefix, ctx, "chat.completion.chunk", ctx.creation_time, None, False)
        delta: dict = {}
        if role:
            delta["role"] = role
        if text:
            delta["content"] = text
        d["choices"] = [{"index": idx, "finish_reason": finish, "delta": delta}]
        return d

    def first_chunk(self, ctx: RespCtx, idx: int) -> Optional[dict]:
        return self.chunk(ctx, None, "assistant", None, idx)

    def last_chunk(self, ctx: RespCtx, finish: str, idx: int) -> Optional[dict]:
        if finish in (TOOLS, CACHE_THRESHOLD):
            return None
        return self.chunk(ctx, None, "", ctx.finish_reason, idx)

    def usage_chunk(self, ctxs: list[RespCtx]) -> Optional[dict]:
        c0 = ctxs[0]
        if not c0.send_usage:
            return None
        d = base_response(self.prefix, c0, "chat.completion.chunk", c0.creation_time, aggregate_usage(ctxs), False)
        d["choices"] = []
        return d


class TextBuilder:
    prefix = "cmpl-"

    def full(self, ctxs: list[RespCtx], texts: list[str]) -> dict:
        c0 = ctxs[0]
        d = base_response(self.prefix, c0, "text_completion", int(time.time()), aggregate_usage(ctxs),
                          c0.do_remote_decode)
        d["choices"] = [{"index": i, "finish_reason": ctxs[i].finish_reason, "text": t} for i, t in enumerate(texts)]
        return d

    def chunk(self, ctx: RespCtx, text: Optional[str], role: str, finish: Optional[str], idx: int) -> dict:
        d = base_response(self.prefix, ctx, "text_completion", ctx.creation_time, None, False)
        d["choices"] = [{"index": idx, "finish_reason": finish, "text": text or ""}]
        return d

    def first_chunk(self, ctx: RespCtx, idx: int) -> Optional[dict]:
        return None

    def last_chunk(self, ctx: RespCtx, finish: str, idx: int) -> Optional[dict]:
        if finish == CACHE_THRESHOLD:
            return None
        return self.chunk(ctx, None, "", ctx.finish_reason, idx)

    def usage_chunk(self, ctxs: list[RespCtx]) -> Optional[dict]:
        c0 = ctxs[0]
        if not c0.send_usage:
            return None
        d = base_response(self.prefix, c0, "text_completion", c0.creation_time, aggregate_usage(ctxs), False)
        d["choices"] = []
        return d


# --------------------------------------------------------------------------------------
# HTTP layer (pkg/communication/http.go)
# --------------------------------------------------------------------------------------

def json_response(obj: Any, status: int = 200, headers: Optional[dict] = None) -> web.Response:
    h = {"Content-Type": "application/json"}
    if headers:
        h.update(headers)
    return web.Response(body=go_json(obj), status=status, headers=h)


def error_response(err: ApiError) -> web.Response:
    return json_response(err.payload(), status=err.code if err.code >= 100 else 500)


def sse(obj: Any) -> bytes:
    return b"data: " + go_json(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


class Server:
    def __init__(self, sim: Simulator):
        self.sim = sim
        self.cfg = sim.cfg

    def _extra_headers(self, request_id: str) -> dict:
        h = {}
        pod = os.environ.get("POD_NAME", "")
        ns = os.environ.get("POD_NAMESPACE", "")
        if pod:
            h["x-inference-pod"] = pod
            h["x-inference-port"] = str(self.cfg.port)
        if ns:
            h["x-inference-namespace"] = ns
        if self.cfg.enable_request_id_headers:
            h["X-Request-Id"] = request_id
        return h

    async def _read_json(self, request: web.Request) -> dict:
        body = await request.read()
        try:
            data = json.loads(body.decode("utf-8") if body else "")
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(f"Failed to read and parse request body, {self._go_json_err(e)}", 400)
        if not isinstance(data, dict):
            kind = {"list": "array", "str": "string", "int": "number", "float": "number", "bool": "bool",
                    "NoneType": "null"}.get(type(data).__name__, type(data).__name__)
            raise ApiError(f"Failed to read and parse request body, json: cannot unmarshal {kind} into Go value", 400)
        return data

    @staticmethod
    def _go_json_err(e: Exception) -> str:
        if isinstance(e, json.JSONDecodeError):
            if e.pos >= len(e.doc.rstrip()):
                return "unexpected end of JSON input"
            ch = e.doc[e.pos]
            if e.msg.startswith("Expecting property name"):
                return f"invalid character '{ch}' looking for beginning of object key string"
            if e.msg.startswith("Expecting ':'"):
                return f"invalid character '{ch}' after object key"
            if e.msg.startswith("Expecting ','"):
                return f"invalid character '{ch}' after object key:value pair"
            if e.msg.startswith("Extra data"):
                return f"invalid character '{ch}' after top-level value"
            return f"invalid character '{ch}' looking for beginning of value"
        return str(e)

    # ---------------- completions ----------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._completions(request, "chat", ChatBuilder())

    async def text_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._completions(request, "text", TextBuilder())

    async def _completions(self, request: web.Request, kind: str, builder) -> web.StreamResponse:
        sim = self.sim
        try:
            data = await self._read_json(request)
            parsed = ParsedRequest(kind, data)
        except ApiError as e:
            return error_response(e)
        request_id = sim.new_request_id(request)

        # X-Return-Error: deterministic failure
        xre = request.headers.get("X-Return-Error", "")
        if xre != "":
            try:
                code = int(xre)
            except ValueError:
                return error_response(ApiError(
                    f"Invalid X-Return-Error header value {json.dumps(xre)}: must be an integer", 400))
            return error_response(ApiError(f"Simulated error triggered by X-Return-Error header (code {code})", code))

        cth = False
        try:
            cth = str2bool(request.headers.get("X-Cache-Threshold-Finish-Reason", "")) if \
                request.headers.get("X-Cache-Threshold-Finish-Reason", "") != "" else False
        except argparse.ArgumentTypeError:
            cth = False

        if not sim.is_valid_model(parsed.model):
            return error_response(ApiError(f"The model `{parsed.model}` does not exist.", 404))
        displayed = self.cfg.served_model_name[0]
        try:
            parsed.validate()
        except ApiError as e:
            return error_response(e)

        events: asyncio.Queue = asyncio.Queue()
        subs: list[SubRequest] = []
        if kind == "chat":
            for _ in range(parsed.n):
                subs.append(SubRequest(parsed, request_id, len(subs), None, displayed, events, cth))
        else:
            for pi, prompt in enumerate(parsed.prompts):
                for _ in range(parsed.n):
                    subs.append(SubRequest(parsed, f"{request_id}-{pi}", len(subs), prompt, displayed, events, cth))
        for s in subs:
            sim.submit(s)

        headers = self._extra_headers(request_id)
        if parsed.stream:
            return await self._stream(request, builder, events, len(subs), headers)
        return await self._non_stream(builder, events, len(subs), headers)

    async def _non_stream(self, builder, events: asyncio.Queue, n: int, headers: dict) -> web.Response:
        texts = [[] for _ in range(n)]
        ctxs: list[Optional[RespCtx]] = [None] * n
        done = 0
        while done < n:
            ev = await events.get()
            typ, idx = ev[0], ev[1]
            if typ == "done":
                done += 1
                continue
            if typ == "error":
                return error_response(ev[2])
            if typ == "token":
                texts[idx].append(ev[3])
            if ctxs[idx] is None:
                ctxs[idx] = ev[2]
        for i, c in enumerate(ctxs):
            if c is None:
                return error_response(ApiError(
                    f"Response body creation failed: no tokens for choice index: {i}", 500))
        return json_response(builder.full(ctxs, ["".join(t) for t in texts]), 200, headers)

    async def _stream(self, request: web.Request, builder, events: asyncio.Queue, n: int,
                      headers: dict) -> web.StreamResponse:
        done = 0

        async def next_event():
            nonlocal done
            while True:
                ev = await events.get()
                if ev[0] == "done":
                    done += 1
                    if done >= n:
                        return None
                    continue
                return ev

        first = await next_event()
        if first is not None and first[0] == "error":
            return error_response(first[2])

        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)

        async def send(obj) -> None:
            if obj is not None:
                await resp.write(obj if isinstance(obj, bytes) else sse(obj))

        resp_ctx: Optional[RespCtx] = None
        first_tokens = [True] * n
        per_choice: list[Optional[RespCtx]] = [None] * n
        try:
            ev = first
            while ev is not None:
                typ, idx = ev[0], ev[1]
                if typ == "error":
                    await send(ev[2].payload())
                    await send(DONE)
                    await resp.write_eof()
                    return resp
                ctx: RespCtx = ev[2]
                if resp_ctx is None:
                    resp_ctx = ctx
                    resp_ctx.creation_time = int(time.time())
                if per_choice[idx] is None:
                    per_choice[idx] = ctx
                if typ == "created":
                    ev = await next_event()
                    continue
                if typ == "token":
                    if first_tokens[idx]:
                        await send(builder.first_chunk(resp_ctx, idx))
                        first_tokens[idx] = False
                    await send(builder.chunk(resp_ctx, ev[3], "", None, idx))
                    ev = await next_event()
                    continue
                # "final": no tokens
                if resp_ctx.finish_reason == CACHE_THRESHOLD:
                    await send(builder.chunk(resp_ctx, None, "", resp_ctx.finish_reason, idx))
                    break
                await send(ApiError("unexpected response part in streaming", 500).payload())
                await send(DONE)
                await resp.write_eof()
                return resp

            if any(c is None for c in per_choice):
                await resp.write_eof()
                return resp
            for i, rc in enumerate(per_choice):
                await send(builder.last_chunk(resp_ctx, rc.finish_reason, i))
            await send(builder.usage_chunk(per_choice))
            await send(DONE)
            await resp.write_eof()
        except ConnectionError:
            # client went away; the simulated generation keeps running in its worker
            pass
        return resp

    # ---------------- render / tokenize ----------------

    async def chat_render(self, request: web.Request) -> web.Response:
        try:
            data = await self._read_json(request)
            parsed = ParsedRequest("chat", data)
            if not parsed.messages:
                raise ApiError("messages must not be empty", 400)
            if not self.sim.is_valid_model(parsed.model):
                raise ApiError(f"The model `{parsed.model}` does not exist.", 404)
        except ApiError as e:
            return error_response(e)
        ids, _ = self.sim.tok.render_messages(parsed.messages)
        return json_response({"token_ids": ids}, 200, self._extra_headers(self.sim.new_request_id(request)))

    async def text_render(self, request: web.Request) -> web.Response:
        try:
            data = await self._read_json(request)
            parsed = ParsedRequest("text", data)
            if not parsed.prompts:
                raise ApiError("prompt array must contain at least one prompt", 400)
            for p in parsed.prompts:
                if isinstance(p, list) and not p:
                    raise ApiError("prompt must not contain an empty token-id array", 400)
                if p == "":
                    raise ApiError("prompt must not contain an empty string", 400)
            if not self.sim.is_valid_model(parsed.model):
                raise ApiError(f"The model `{parsed.model}` does not exist.", 404)
        except ApiError as e:
            return error_response(e)
        out = [{"token_ids": list(p) if isinstance(p, list) else self.sim.tok.tokenize(p)[0]}
               for p in parsed.prompts]
        return json_response(out, 200, self._extra_headers(self.sim.new_request_id(request)))

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            data = json.loads(body.decode("utf-8") if body else "")
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as e:
            return error_response(ApiError("Failed to read and parse tokenize request body, " + str(e), 400))
        prompt = data.get("prompt") or ""
        messages = data.get("messages")
        if prompt and messages is not None:
            return error_response(ApiError("both prompt and messages fields in tokenize request", 400))
        if prompt:
            ids = self.sim.tok.tokenize(str(prompt))[0]
        else:
            ids = self.sim.tok.render_messages([m for m in (messages or []) if isinstance(m, dict)])[0]
        return json_response({"max_model_len": self.cfg.max_model_len, "count": len(ids), "tokens": ids,
                              "token_strs": None})

    # ---------------- misc endpoints ----------------

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        data = [{"id": alias, "object": "model", "created": now, "owned_by": "vllm", "root": self.cfg.model,
                 "parent": None, "max_model_len": self.cfg.max_model_len}
                for alias in self.cfg.served_model_name]
        return json_response({"object": "list", "data": data})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200, headers={"Content-Type": "application/json"})

    async def ready(self, request: web.Request) -> web.Response:
        d = self.cfg.startup_duration
        if d > 0 and (time.monotonic() - self.sim.start_time) * 1e9 < d:
            return web.Response(status=503, headers={"Content-Type": "application/json"})
        return web.Response(status=200, headers={"Content-Type": "application/json"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.sim.metrics.render().encode("utf-8"), status=200,
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def make_app(cfg: argparse.Namespace) -> web.Application:
    sim = Simulator(cfg)
    srv = Server(sim)
    app = web.Application(client_max_size=cfg.max_request_body_size_mb * 1024 * 1024)
    app["sim"] = sim
    app.router.add_post("/v1/chat/completions", srv.chat_completions)
    app.router.add_post("/v1/completions", srv.text_completions)
    app.router.add_post("/v1/chat/completions/render", srv.chat_render)
    app.router.add_post("/v1/completions/render", srv.text_render)
    app.router.add_post("/tokenize", srv.tokenize)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/health/ready", srv.ready)
    app.router.add_get("/ready", srv.ready)
    app.router.add_get("/metrics", srv.metrics)
    return app


def main(argv: Optional[list[str]] = None) -> None:
    cfg = parse_config(sys.argv[1:] if argv is None else argv)
    app = make_app(cfg)
    print(f"llm-d-inference-sim replica: model={cfg.model} served={cfg.served_model_name} "
          f"listening on {cfg.host}:{cfg.port} calculator={cfg.latency_calculator or 'default'} "
          f"kvcache={cfg.enable_kvcache} seed={cfg.seed}", file=sys.stderr, flush=True)
    web.run_app(app, host=cfg.host, port=cfg.port, access_log=None, print=None, handle_signals=True)


if __name__ == "__main__":
    main()
