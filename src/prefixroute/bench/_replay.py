"""Replay a simulator workload against a live URL with open-loop sessions.

Each session runs as a task: its first turn is sent at ``start_s``, each later turn ``think_s``
after the previous answer ended, exactly as the simulator schedules them. Wall-clock times are
divided by ``time_scale`` so a run against emulated replicas sped up by the same factor reports
times in the workload's own seconds, comparable with ``simulate`` line by line.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import numpy as np

from prefixroute.bench._client import Outcome, stream_completion
from prefixroute.sim.cluster import ReplicaRecord, RequestRecord, RunResult
from prefixroute.sim.workload import Session, Turn, Workload


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    url: str  # base URL of the gateway or replica, e.g. http://127.0.0.1:8000
    model: str | None = None  # "model" field of each request (None: omitted)
    time_scale: float = 1.0  # wall seconds per workload second
    timeout_s: float = 300.0  # per request, wall seconds
    max_connections: int = 1024


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


async def replay(
    workload: Workload,
    cfg: ReplayConfig,
    label: str,
    on_done: Callable[[int], None] | None = None,
) -> ReplayResult:
    url = cfg.url.rstrip("/") + "/v1/completions"
    records: list[RequestRecord] = []
    itl: list[float] = []
    errors: list[str] = []
    done = 0
    connector = aiohttp.TCPConnector(limit=cfg.max_connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=10)
    t_start = time.perf_counter()

    def clock() -> float:
        return (time.perf_counter() - t_start) / cfg.time_scale

    async def run_session(session: Session, http: aiohttp.ClientSession) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, session.start_s * cfg.time_scale))
        for i, turn in enumerate(session.turns):
            if i:
                await asyncio.sleep(turn.think_s * cfg.time_scale)
            body: dict[str, object] = {
                "prompt": prompt_text(turn),
                "max_tokens": turn.output_tokens,
                "min_tokens": turn.output_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if cfg.model:
                body["model"] = cfg.model
            rec = RequestRecord(
                request_id=f"{session.session_id}/{i}",
                session_id=session.session_id,
                turn=i,
                arrival_s=clock(),
                prompt_tokens=len(turn.tokens),
                output_tokens=turn.output_tokens,
            )
            records.append(rec)
            out = await stream_completion(http, url, body)
            _fill(rec, out, cfg.time_scale)
            itl.extend(g / cfg.time_scale for g in out.itl_s)
            done += 1
            if on_done is not None:
                on_done(done)
            if not out.ok:
                errors.append(out.error or f"HTTP {out.status}")
                return  # a conversation stops at its first failed turn

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(run_session(s, http) for s in workload.sessions))
    finish = [r.finish_s for r in records if r.finish_s is not None]
    per_replica = Counter(r.replica for r in records if r.replica)
    run = RunResult(
        policy=label,
        workload=workload.name,
        block_size=workload.block_size,
        duration_s=max(finish, default=0.0),
        records=records,
        replicas=[ReplicaRecord(name, requests=n) for name, n in sorted(per_replica.items())],
        index_blocks=0,
        index_evictions=0,
        events=0,
        wall_s=time.perf_counter() - t_start,
    )
    return ReplayResult(run, itl, errors)


def _fill(rec: RequestRecord, out: Outcome, scale: float) -> None:
    rec.replica = out.replica
    rec.reason = out.reason
    if out.prompt_tokens is not None:
        rec.prompt_tokens = out.prompt_tokens  # what the replica counted
    if out.ok and out.ttft_s is not None and out.e2e_s is not None:
        rec.first_token_s = rec.arrival_s + out.ttft_s / scale
        rec.finish_s = rec.arrival_s + out.e2e_s / scale
        rec.cached_tokens = out.cached_tokens or 0


def itl_percentiles(itl_s: list[float]) -> dict[str, float]:
    if not itl_s:
        return {}
    arr = np.asarray(itl_s) * 1000.0
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(arr.mean())}
