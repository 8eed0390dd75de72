"""Precise-mode benchmarks: tokenization per request, and KV-event throughput.

Each figure is printed beside a baseline measured in the same run:

* tokenization (the model tokenizer of tests/data/tiny-tokenizer, a byte-level BPE): the cost
  of keying one request by its token ids, chat template included, against hashing the same
  tokens into blocks (what every request costs anyway); and how long the event loop stalls
  while 40 prompts are tokenized in the gateway's worker threads vs inline on the loop;
* events: KV-event batches (16 blocks of 32 tokens each, vLLM's shape) decoded and applied to
  the index per second, against decoding alone; and the same over ZMQ on loopback, publisher
  to subscriber, which is the rate one replica's stream can sustain.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import zmq.asyncio

from prefixroute.core import BlockHasher, Endpoint, PrefixIndex, ReplicaId
from prefixroute.events import (
    BlockStored,
    EventEndpoint,
    EventPublisher,
    EventSubscriber,
    KVEventBatch,
    PreciseIndexer,
    decode_batch,
    encode_array_batch,
    encode_batch,
)
from prefixroute.gateway import HFTokenizer, TokenizerPool, key_of, parse_body

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny-tokenizer"
WORDS = ("the", "cache", "of", "a", "prefix", "is", "reused", "when", "the", "router", "sends")
BLOCK = 32
R = ReplicaId("r")


def text(tokens_approx: int) -> str:
    return " ".join(f"{WORDS[i % len(WORDS)]}{i % 97}" for i in range(tokens_approx // 3))


def median_s(fn: object, repeat: int = 30) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_tokenize() -> None:
    tok = HFTokenizer(TOKENIZER)
    hasher = BlockHasher(BLOCK)
    print("## tokenization per request (median of 30), vs hashing the same tokens")
    print("| prompt | tokens | tokenize µs | µs/token | hash µs | tokenize/hash |")
    print("|---|---|---|---|---|---|")
    for label, approx in (("400", 400), ("1,700", 1700), ("8,000", 8000), ("32,000", 32000)):
        messages = [
            {"role": "system", "content": text(200)},
            {"role": "user", "content": text(max(1, approx - 200))},
        ]
        ids = tok.encode_chat(messages)
        t_tok = median_s(lambda m=messages: tok.encode_chat(m))
        t_hash = median_s(lambda i=ids: hasher.hash_tokens(i))
        print(
            f"| chat {label} | {len(ids)} | {t_tok * 1e6:.0f} | {t_tok * 1e6 / len(ids):.2f} | "
            f"{t_hash * 1e6:.0f} | {t_tok / t_hash:.0f}x |"
        )
    asyncio.run(_loop_stall(tok))


async def _loop_stall(tok: HFTokenizer) -> None:
    """Largest gap between ticks of a 1 ms ticker while 40 8k-token prompts are tokenized."""
    body = (
        b'{"messages": [{"role": "user", "content": "' + text(8000).encode() + b'"}]}'
    )  # fmt: skip
    key = key_of(Endpoint.CHAT, parse_body(body))
    assert key.messages is not None

    async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def measure(label: str, work: object) -> None:
        stop, gaps = asyncio.Event(), list[float]()
        task = asyncio.create_task(ticker(stop, gaps))
        t = time.perf_counter()
        await work()  # type: ignore[operator]
        wall = time.perf_counter() - t
        stop.set()
        await task
        print(
            f"| {label} | {wall * 1e3:.0f} | {max(gaps) * 1e3:.1f} | "
            f"{statistics.quantiles(gaps, n=100)[98] * 1e3:.1f} |"
        )

    workers = max(1, (os.cpu_count() or 2) - 1)  # the gateway's choice
    pool = TokenizerPool(tok, workers=workers)

    async def threaded() -> None:
        await asyncio.gather(*(pool.key(key) for _ in range(40)))

    async def inline() -> None:
        for _ in range(40):
            tok.encode_chat(key.messages)  # type: ignore[arg-type]
            await asyncio.sleep(0)

    print("\n## event-loop stall while 40 chat prompts of ~8k tokens are tokenized")
    print("| where | wall ms | longest loop gap ms | p99 gap ms |")
    print("|---|---|---|---|")
    await measure("inline on the loop (baseline)", inline)
    await measure(f"TokenizerPool, {workers} thread(s)", threaded)
    pool.shutdown()


def batch_payload(n_batches: int, blocks: int = 16, positional: bool = False) -> list[bytes]:
    """A chain of batches, each storing ``blocks`` blocks after the previous batch's last;
    ``positional``: each event an array, as SGLang and vLLM before maps send it."""
    out = []
    parent: int | None = None
    for b in range(n_batches):
        hashes: list[bytes | int] = [b * blocks + i + 1 for i in range(blocks)]
        tokens = [(b * blocks * BLOCK + j) % 50_000 for j in range(blocks * BLOCK)]
        event = BlockStored(hashes, parent, tokens, BLOCK, None, "GPU", None)
        if positional:
            out.append(encode_array_batch(1.0, [event]))
        else:
            out.append(encode_batch(KVEventBatch(1.0, [event])))
        parent = b * blocks + blocks
    return out


def bench_events() -> None:
    n = 2000
    payloads = batch_payload(n)
    t = time.perf_counter()
    for p in payloads:
        decode_batch(p)
    decode_s = time.perf_counter() - t
    index = PrefixIndex()
    index.add_replica(R)
    ix = PreciseIndexer(R, index, BlockHasher(BLOCK))
    t = time.perf_counter()
    for p in payloads:
        ix.apply(decode_batch(p))
    apply_s = time.perf_counter() - t
    positional = batch_payload(n, positional=True)
    t = time.perf_counter()
    for p in positional:
        decode_batch(p)
    positional_s = time.perf_counter() - t
    print("\n## KV events: batches of 16 blocks x 32 tokens (one 512-token prefill each)")
    print("| path | batches/s | blocks/s | µs/batch | vs decode only |")
    print("|---|---|---|---|---|")
    print(f"| decode only (baseline) | {n / decode_s:,.0f} | {16 * n / decode_s:,.0f} | "
          f"{decode_s / n * 1e6:.1f} | 1.0x |")  # fmt: skip
    print(f"| decode + index | {n / apply_s:,.0f} | {16 * n / apply_s:,.0f} | "
          f"{apply_s / n * 1e6:.1f} | {apply_s / decode_s:.1f}x |")  # fmt: skip
    print(f"| decode only, positional form (SGLang) | {n / positional_s:,.0f} | "
          f"{16 * n / positional_s:,.0f} | {positional_s / n * 1e6:.1f} | "
          f"{positional_s / decode_s:.1f}x |")  # fmt: skip
    zmq_s = asyncio.run(_over_zmq(payloads))
    print(f"| ZMQ loopback, publish -> index | {n / zmq_s:,.0f} | {16 * n / zmq_s:,.0f} | "
          f"{zmq_s / n * 1e6:.1f} | {zmq_s / decode_s:.1f}x |")  # fmt: skip


async def _over_zmq(payloads: list[bytes]) -> float:
    context = zmq.asyncio.Context()
    index = PrefixIndex()
    index.add_replica(R)
    pub = EventPublisher(EventEndpoint.parse("bind:tcp://127.0.0.1:*"), context)
    await pub.start()
    assert pub.address is not None
    sub = EventSubscriber(
        EventEndpoint(pub.address, False), PreciseIndexer(R, index, BlockHasher(BLOCK)), context
    )
    await sub.start()
    while sub.stats.batches == 0:  # the subscription has reached the publisher
        pub.publish([])
        await asyncio.sleep(0.01)
    start_batches = sub.stats.batches
    batches = [decode_batch(p) for p in payloads]
    t = time.perf_counter()
    for i, batch in enumerate(batches):
        pub.publish(batch.events)
        if i % 64 == 63:
            await asyncio.sleep(0)  # let the subscriber run, as a real engine's pace would
    while sub.stats.batches < start_batches + len(batches):
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - t
    assert sub.stats.gaps == 0, "the benchmark lost batches"
    await sub.stop()
    await pub.stop()
    context.term()
    return elapsed


def main() -> None:
    bench_tokenize()
    bench_events()


if __name__ == "__main__":
    main()
