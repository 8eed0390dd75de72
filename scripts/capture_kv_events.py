"""Record real vLLM KV-event messages into the decoder's test fixture.

    .venv/bin/python scripts/capture_kv_events.py [OUT]
    # OUT defaults to tests/data/vllm-0.32.0-kv-events.msgpack

Starts one vLLM (from .cache/vllm-venv, model .cache/tiny-llama: run scripts/setup_vllm.sh and
scripts/make_tiny_model.py first) with a KV cache of only 32 blocks of 32 tokens, so that a
longer prompt evicts and the stream has ``BlockRemoved`` events too. It binds a SUB socket,
sends a one-block request until its event arrives (the stream is connected), then a fixed list of
requests (each waits for the previous), resets the prefix cache (so an ``AllBlocksCleared``
follows), and writes every message's three frames, byte for byte, with the
requests and vLLM's own usage, as msgpack::

    {"vllm": "0.32.0", "block_size": 32, "tokenizer": "...",
     "requests": [{"path", "body", "usage", "messages_before"}],
     "messages": [[topic, seq, payload], ...]}

The default suite decodes those bytes (tests/events/test_wire.py) and checks its tokenizer and
indexer against them, so the fixture pins the wire format and the tokenization of a real engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import msgspec
import zmq

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".cache/vllm-venv/bin/python"
MODEL = ROOT / ".cache/tiny-llama"
OUT = ROOT / "tests/data/vllm-0.32.0-kv-events.msgpack"
PORT, EVENTS_PORT = 8191, 5691
BLOCKS = 32


def text(n: int, salt: str) -> str:
    return " ".join(f"{salt}{i} cache the" for i in range(n))


REQUESTS: list[tuple[str, dict[str, object]]] = [
    ("/v1/completions", {"prompt": text(60, "w"), "max_tokens": 4}),
    ("/v1/completions", {"prompt": text(60, "w"), "max_tokens": 4}),  # a hit: no new blocks
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": text(40, "s")},
                {"role": "user", "content": "Which replica holds the prefix?"},
            ],
            "max_tokens": 40,  # long enough to fill a block of output tokens
        },
    ),
    ("/v1/completions", {"prompt": text(150, "x"), "max_tokens": 4}),  # evicts: BlockRemoved
    ("/reset_prefix_cache", {}),
    ("/v1/completions", {"prompt": text(20, "y"), "max_tokens": 4}),  # AllBlocksCleared first
]


def post(path: str, body: dict[str, object]) -> dict[str, object]:
    if path.startswith("/v1/"):
        body = {"model": "tiny", **body}
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw.strip().startswith(b"{") else {}


def wait_ready(proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"capture: vLLM exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit("capture: vLLM did not become ready")


def sync(sub: zmq.Socket[bytes], messages: list[list[bytes]]) -> None:
    """Send a one-block prompt until its event arrives: a PUB socket drops what it publishes
    before the subscription has reached it (seen here: the first batch after startup)."""
    for attempt in range(10):
        post("/v1/completions", {"prompt": text(12, f"sync{attempt}-"), "max_tokens": 1})
        if sub.poll(2000):
            while sub.poll(200):
                messages.append(sub.recv_multipart())
            return
    raise SystemExit("capture: no KV event arrived from vLLM")


def main(out: Path) -> int:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{EVENTS_PORT}")
    events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{EVENTS_PORT}",
    }
    cmd = [
        str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL), "--served-model-name", "tiny", "--port", str(PORT),
        "--block-size", "32", "--enforce-eager", "--enable-prompt-tokens-details",
        "--max-model-len", str((BLOCKS - 1) * 32), "--dtype", "float32",
        "--num-gpu-blocks-override", str(BLOCKS), "--max-num-seqs", "4",
        "--kv-events-config", json.dumps(events),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    env["VLLM_SERVER_DEV_MODE"] = "1"  # for /reset_prefix_cache
    log = open(ROOT / ".cache/capture-vllm.log", "wb")  # noqa: SIM115 - lives as the process
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    messages: list[list[bytes]] = []
    requests = []
    try:
        wait_ready(proc)
        sync(sub, messages)
        for path, body in REQUESTS:
            before = len(messages)  # the messages the gateway had when it routed this one
            reply = post(path, body)
            record = {"path": path, "body": body, "usage": reply.get("usage")}
            requests.append({**record, "messages_before": before})
            time.sleep(0.5)
            while sub.poll(200):
                messages.append(sub.recv_multipart())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        sub.close(linger=0)
        ctx.term()
    fixture = {
        "vllm": "0.32.0",
        "block_size": 32,
        "tokenizer": "tests/data/tiny-tokenizer",
        "requests": requests,
        "messages": messages,
    }
    out.write_bytes(msgspec.msgpack.encode(fixture))
    print(f"capture: {len(messages)} messages, {len(requests)} requests -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
