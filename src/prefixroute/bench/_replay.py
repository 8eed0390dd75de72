"""Replay a simulator workload against a live URL with open-loop sessions.

Each session runs as a task: its first turn is sent at ``start_s``, each later turn ``think_s``
after the previous answer ended, exactly as the simulator schedules them. Wall-clock times are
divided by ``time_scale`` so a run against emulated replicas sped up by the same factor reports
times in the workload's own seconds, comparable with ``simulate`` line by line.

Each turn is a completion (its text the prompt), or with ``api="messages"`` an Anthropic Messages
request (its text one user message), for a fleet served through that API (Claude Code's).

With ``plain`` (a share, 0..1) that share of the requests asks for no stream, as clients that
do not stream do (batch jobs, SDK defaults), drawn per request from ``seed`` as ``simulate
--plain`` draws them. A plain answer shows no first token: its record has an end and usage but
no TTFT, so TTFT percentiles and the SLO are over the streamed requests only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from prefixroute._pool import upstream_connector
from prefixroute.bench._client import Outcome, plain_completion, stream_completion
from prefixroute.sim import ReplicaRecord, RequestRecord, RunResult, Session, Turn, Workload


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    url: str  # base URL of the gateway or replica, e.g. http://127.0.0.1:8000
    model: str | None = None  # "model" field of each request (None: omitted)
    time_scale: float = 1.0  # wall seconds per workload second
    timeout_s: float = 300.0  # per request, wall seconds
    max_connections: int = 1024
    plain: float = 0.0  # share of the requests sent without a stream (module docstring)
    seed: int = 0  # draws which requests are plain
    api: str = "completions"  # the call each turn is: one of APIS (module docstring)
    # The replicas' KV block size, tokens: a prediction is stale when a block or more fewer
    # were found, as the gateway counts it (None: the workload's, the emulated replicas').
    kv_block: int | None = None

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, not {self.api!r}")


# The calls a turn can be sent as, by name: OpenAI's completion (its text the prompt) or
# Anthropic's Messages API (which vLLM serves; its text one user message).
APIS = {"completions": "/v1/completions", "messages": "/v1/messages"}


def prompt_text(turn: Turn) -> str:
    """The turn's text, or its token ids rendered one word per token ("w17 w4 ...")."""
    if turn.text is not None:
        return turn.text
    return " ".join(f"w{t}" for t in turn.tokens.tolist())


@dataclass(slots=True)
class ReplayResult:
    run: RunResult
    itl_s: list[float]  # every inter-token gap, workload seconds
    errors: list[str]
    # The replicas' prompt tokens per workload token, over the answers that reported usage
    # (None: none did). A real tokenizer splits the workload's words otherwise than the
    # workload counts them, so its floor is in other units (``token_scale``).
    token_scale: float | None = None
    cached_reported: int = 0  # answers whose usage gave cached tokens (0: hits not measured)


async def replay(
    workload: Workload,
    cfg: ReplayConfig,
    label: str,
    on_done: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Every session of ``workload`` sent to ``cfg.url``, as the simulator schedules them;
    ``on_done(n)`` after each answer (a progress bar). The run is named ``label``."""
    run = _Replay(cfg, on_done)
    # Idle connections closed before the server closes them, and a request on one it closed
    # meanwhile resent (_pool): the server never read it, so it is no error of the server's.
    connector = upstream_connector(limit=cfg.max_connections)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(run.session(s, http) for s in workload.sessions))
    records = run.records
    finish = [r.finish_s for r in records if r.finish_s is not None]
    per_replica = Counter(r.replica for r in records if r.replica)
    result = RunResult(
        policy=label,
        workload=workload.name,
        block_size=cfg.kv_block or workload.block_size,
        duration_s=max(finish, default=0.0),
        records=records,
        replicas=[ReplicaRecord(name, requests=n) for name, n in sorted(per_replica.items())],
        index_blocks=None,  # the router's index, decision times, evictions, busy time and
        index_evictions=None,  # learned speeds are not seen from outside: None, not 0
        events=0,
        wall_s=time.perf_counter() - run.t_start,
        live=True,
    )
    scale = run.reported_tokens / run.counted_tokens if run.counted_tokens else None
    return ReplayResult(result, run.itl, run.errors, scale, run.cached_reported)


class _Replay:
    """One replay's clock and what it collects, shared by its session tasks."""

    def __init__(self, cfg: ReplayConfig, on_done: Callable[[int], None] | None) -> None:
        self.cfg = cfg
        self.on_done = on_done
        self.records: list[RequestRecord] = []
        self.itl: list[float] = []  # every inter-token gap, workload seconds
        self.errors: list[str] = []
        self.done = 0  # requests answered (or failed)
        self.counted_tokens = 0  # the workload's prompt tokens of answers that reported usage
        self.reported_tokens = 0  # what the replicas counted for those prompts
        self.cached_reported = 0  # answers that said how many of their tokens were cached
        self.t_start = time.perf_counter()

    def is_plain(self, request_id: str) -> bool:
        """Whether the request asks for no stream: drawn from the seed and its id, so a
        request is plain or not whatever order the sessions' tasks run in."""
        share = self.cfg.plain
        return share > 0 and random.Random(f"{self.cfg.seed}/{request_id}").random() < share

    def clock(self) -> float:
        """Workload seconds since the replay started."""
        return (time.perf_counter() - self.t_start) / self.cfg.time_scale

    async def session(self, session: Session, http: aiohttp.ClientSession) -> None:
        """One conversation: its first turn at ``start_s``, each later one ``think_s`` after
        the previous answer ended; it stops at its first failed turn."""
        scale = self.cfg.time_scale
        await asyncio.sleep(max(0.0, session.start_s * scale))
        for i, turn in enumerate(session.turns):
            if i:
                await asyncio.sleep(turn.think_s * scale)
            if not await self._turn(session, i, turn, http):
                return

    async def _turn(
        self, session: Session, i: int, turn: Turn, http: aiohttp.ClientSession
    ) -> bool:
        """Send one turn and record it; False when it failed."""
        body = _body(turn, self.cfg.model, self.cfg.api)  # built before the arrival time
        rec = RequestRecord(
            request_id=f"{session.session_id}/{i}",
            session_id=session.session_id,
            turn=i,
            arrival_s=self.clock(),
            prompt_tokens=len(turn.tokens),
            output_tokens=turn.output_tokens,
        )
        self.records.append(rec)
        url = self.cfg.url.rstrip("/") + APIS[self.cfg.api]
        if self.is_plain(rec.request_id):
            rec.plain = True
            del body["stream"]
            body.pop("stream_options", None)
            out = await plain_completion(http, url, body)
        else:
            out = await stream_completion(http, url, body)
        if out.prompt_tokens is not None:
            self.counted_tokens += len(turn.tokens)
            self.reported_tokens += out.prompt_tokens
        self.cached_reported += out.cached_tokens is not None
        _fill(rec, out, self.cfg.time_scale)
        self.itl.extend(g / self.cfg.time_scale for g in out.itl_s)
        self.done += 1
        if self.on_done is not None:
            self.on_done(self.done)
        if not out.ok:
            self.errors.append(out.error or f"HTTP {out.status}")
        return out.ok


def _body(turn: Turn, model: str | None, api: str = "completions") -> dict[str, object]:
    """A streamed completion that generates exactly the turn's output tokens; as a Messages
    request, its text is one user message (vLLM's Messages API takes no ``min_tokens``: the
    answer may end sooner), and its stream carries its usage unasked."""
    if api == "messages":
        body: dict[str, object] = {
            "messages": [{"role": "user", "content": prompt_text(turn)}],
            "max_tokens": turn.output_tokens,
            "stream": True,
        }
    else:
        body = {
            "prompt": prompt_text(turn),
            "max_tokens": turn.output_tokens,
            "min_tokens": turn.output_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    if model:
        body["model"] = model
    return body


def _fill(rec: RequestRecord, out: Outcome, scale: float) -> None:
    rec.replica = out.replica
    rec.reason = out.reason
    rec.predicted_cached_tokens = out.predicted_cached_tokens  # None: no gateway said
    rec.cached_reported = out.ok and out.cached_tokens is not None
    if out.prompt_tokens is not None:
        rec.prompt_tokens = out.prompt_tokens  # what the replica counted
    if out.ok and out.e2e_s is not None:
        if out.ttft_s is not None:  # a plain answer's is not seen
            rec.first_token_s = rec.arrival_s + out.ttft_s / scale
        rec.finish_s = rec.arrival_s + out.e2e_s / scale
        rec.cached_tokens = out.cached_tokens or 0


def itl_percentiles(itl_s: list[float]) -> dict[str, float]:
    if not itl_s:
        return {}
    arr = np.asarray(itl_s) * 1000.0
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}
