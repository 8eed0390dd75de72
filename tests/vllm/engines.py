"""Real vLLM replicas for the tests: processes started from .cache/vllm-venv, on the CPU.

Each replica serves the tiny local model (scripts/make_tiny_model.py) with vLLM's OpenAI server
and publishes its KV events over ZMQ. ``VLLM_SERVER_DEV_MODE=1`` mounts ``/reset_prefix_cache``,
which the tests call between modes so each mode starts from cold caches (and which makes vLLM
publish ``AllBlocksCleared``), and ``/server_info``, where the gateway reads the batch size.
Logs go to .cache/vllm-logs/.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from polling import answers_200

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".cache" / "vllm-venv" / "bin" / "python"
MODEL = ROOT / ".cache" / "tiny-llama"
LOGS = ROOT / ".cache" / "vllm-logs"
BLOCK_SIZE = 32  # tokens per KV block (--block-size)
MODEL_NAME = "tiny"
MAX_MODEL_LEN = 4096  # tokens
MAX_NUM_SEQS = 128  # requests in a batch (--max-num-seqs; vLLM 0.32's default on the CPU)
STARTUP_TIMEOUT_S = 300.0  # two engines starting at once on two cores: ~60 s seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing() -> str | None:
    """Why real-vLLM tests cannot run here, or None."""
    if not VLLM_PYTHON.exists():
        return f"no vLLM venv at {VLLM_PYTHON} (run `make vllm-setup`)"
    if not (MODEL / "config.json").exists():
        return f"no tiny model at {MODEL} (run `make vllm-setup`)"
    return None


@dataclass
class VLLMServer:
    """One vLLM OpenAI server process and its KV-event endpoint (vLLM's side of it)."""

    name: str
    port: int
    events_endpoint: str  # vLLM's --kv-events-config endpoint ("*" binds, a host connects)
    gateway_spec: str = ""  # the gateway's side of that stream, as --kv-events takes it
    replay_endpoint: str | None = None  # vLLM's replay ROUTER (it binds)
    cpu: int | None = None  # pin the engine (all its processes) to this core
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(default_factory=Path)
    started_s: float = 0.0  # time the process took to answer /health, seconds

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{self.name}.log"
        events: dict[str, object] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.events_endpoint,
        }
        if self.replay_endpoint is not None:
            events["replay_endpoint"] = self.replay_endpoint
        cmd = [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--block-size", str(BLOCK_SIZE), "--enforce-eager", "--enable-prompt-tokens-details",
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--seed", "0",
            "--max-num-seqs", str(MAX_NUM_SEQS),
            "--kv-events-config", json.dumps(events),
        ]  # fmt: skip
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: 262,144 tokens of this model's KV cache
            "HF_HUB_OFFLINE": "1",
            "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache, /server_info
            # Store Responses API answers, so that previous_response_id can name them
            # (test_responses.py); vLLM keeps them in memory, and only then.
            "VLLM_ENABLE_RESPONSES_API_STORE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_OMP_THREADS_BIND": str(self.cpu) if self.cpu is not None else "auto",
        }
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if self.cpu is not None:
            # The whole engine on its core, not only the model's threads: its engine-core process
            # busy-polls the worker for a second after each reply, a core's worth of CPU while
            # the worker computes. Left free, it ran on the other engine's core, so each
            # engine prefilled slower whenever the other was busy: one replica's speed set by
            # its neighbour's traffic, which no router can see (real replicas do not share
            # cores). Set now, before the server starts its processes: they inherit it.
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        self._log = log
        self._t0 = time.monotonic()

    def wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"vLLM {self.name} exited ({code}): {self.tail()}")
            if answers_200(self.url + "/health", timeout_s=2):
                self.started_s = time.monotonic() - self._t0
                self.build_server_info()
                return
            time.sleep(0.5)
        raise RuntimeError(f"vLLM {self.name} not ready in time: {self.tail()}")

    def build_server_info(self) -> None:
        """Have vLLM build its ``/server_info`` environment report now. Its first one takes
        about 1.4 s of CPU in the API server, on this engine's own core, and every gateway asks
        for it when an engine joins (gateway/_server_info.py): asked first in a test, it slowed
        the engine through that test's first requests, and a speed model that learned from them
        predicted the rest at 1.3-1.4x (p50 error 0.40-0.44 at six in flight, against 0.14-0.18
        with the report built before). A GPU server's API process does not share the engine's
        core; this rig's does."""
        with urllib.request.urlopen(self.url + "/server_info?config_format=json", timeout=60):
            pass

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the engine core goes too
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def reset_prefix_cache(self) -> None:
        post(self.url + "/reset_prefix_cache", {})


def post(url: str, body: dict[str, object], timeout_s: float = 60.0) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        raw = resp.read()
    out = json.loads(raw) if raw.strip().startswith(b"{") else {}
    assert isinstance(out, dict)
    return out
