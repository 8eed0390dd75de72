"""Two real vLLM replicas for the whole session (they take ~a minute to start).

Replica 0's engine connects its PUB socket to the gateway (the gateway binds); replica 1's
engine binds PUB and a replay ROUTER (the gateway connects): both directions of precise mode
against the real thing. Without a vLLM venv and model the tests are skipped, unless
``PREFIXROUTE_VLLM_REQUIRED=1`` (``make test-vllm``), where that is a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from .engines import STARTUP_TIMEOUT_S, VLLMServer, free_port, missing


@pytest.fixture(scope="session")
def engines() -> Iterator[list[VLLMServer]]:
    why = missing()
    if why is not None:
        if os.environ.get("PREFIXROUTE_VLLM_REQUIRED") == "1":
            pytest.fail(why)
        pytest.skip(why)
    p0, p1, r1 = free_port(), free_port(), free_port()
    servers = [
        VLLMServer(
            "vllm-0", free_port(), f"tcp://127.0.0.1:{p0}", f"bind:tcp://127.0.0.1:{p0}", cpu=0
        ),
        VLLMServer(
            "vllm-1",
            free_port(),
            f"tcp://*:{p1}",
            f"connect:tcp://127.0.0.1:{p1},replay=tcp://127.0.0.1:{r1}",
            replay_endpoint=f"tcp://*:{r1}",
            cpu=1,
        ),
    ]
    try:
        for s in servers:
            s.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for s in servers:
            s.wait_ready(deadline)
        yield servers
    finally:
        for s in servers:
            s.stop()
