"""The recorded real vLLM 0.32.0 KV events (scripts/capture_kv_events.py) and their requests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURE = DATA / "vllm-0.32.0-kv-events.msgpack"
TOKENIZER = DATA / "tiny-tokenizer"


@dataclass(frozen=True)
class Recording:
    block_size: int  # the engine's --block-size, tokens
    requests: list[dict[str, Any]]  # {"path", "body", "usage", "messages_before"}, in order
    messages: list[list[bytes]]  # each message's frames, byte for byte as received


def load() -> Recording:
    raw = msgspec.msgpack.decode(FIXTURE.read_bytes())
    return Recording(raw["block_size"], raw["requests"], raw["messages"])
