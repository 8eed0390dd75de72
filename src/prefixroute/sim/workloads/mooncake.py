"""mooncake: replay of a Mooncake production trace (kvcache-ai/Mooncake, FAST'25 release).

Each trace row gives an arrival time (ms), input and output lengths and one hash id per 512-token
block; two requests share their first k blocks exactly when their first k hash ids agree. We turn
each hash id into a fixed block of ``block_tokens`` ids derived from the id (equal ids, equal
blocks) and scale every length by ``block_tokens / 512``, cutting the last block to the scaled
input length, so the trace's prefix structure survives at a fraction of the tokens.

The trace rounds arrivals to ~3 s steps; replaying them as bursts would measure the rounding, so
each arrival moves uniformly within ``jitter_s``. Trace time is then multiplied by ``time_scale``;
left at 0 it is derived so the prompt tokens offered per second are ``load`` times the cluster's
prefill capacity (70% of 4 replicas x 10,000 tokens/s by default), whatever the trace or limit.

``copies`` replays the trace that many times at once, as that many independent user populations:
copy c adds ``c * (largest hash id + 1)`` to every hash id, so requests share prefixes within a
copy exactly as in the trace and never across copies, and each copy draws its own jitter. The
12,031-row conversation trace tiled 84 times gives the 1,000,000-request scale run
(``benchmarks/scale_sim.py``); set ``capacity_tokens_per_s`` to the cluster's prefill rate.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from prefixroute.core import ConfigError
from prefixroute.sim.workload import Session, SessionSource, Turn, Workload
from prefixroute.sim.workloads._build import frozen
from prefixroute.sim.workloads._config import check_non_negative, check_positive, param
from prefixroute.sim.workloads._data import data_file

TRACE_BLOCK = 512  # tokens per hash id in the Mooncake traces
TRACES = ("conversation", "synthetic")


@dataclass(frozen=True, slots=True)
class MooncakeConfig:
    trace: str = param("conversation", "which trace: conversation or synthetic")
    path: str = param("", "a trace file to read instead (Mooncake JSON lines)")
    limit: int = param(4000, "replay the trace's first requests only (0: all)")
    block_tokens: int = param(32, "tokens per hash id (the trace's 512, scaled down)")
    jitter_s: float = param(1.5, "arrivals move uniformly within +/- this, trace seconds")
    load: float = param(0.7, "prompt tokens offered / capacity, when time_scale is 0")
    capacity_tokens_per_s: float = param(40_000.0, "prefill capacity, tokens/s (4 x 10,000)")
    time_scale: float = param(0.0, "replay time / trace time (0: derived from load)")
    copies: int = param(1, "replay the trace this many times at once, hash ids offset per copy")

    def __post_init__(self) -> None:
        if self.trace not in TRACES and not self.path:
            raise ConfigError(f"trace must be one of {', '.join(TRACES)}, got {self.trace!r}")
        check_positive(self, "block_tokens", "load", "capacity_tokens_per_s", "copies")
        check_non_negative(self, "limit", "jitter_s", "time_scale")


_FIELDS = ("hash_ids", "input_length", "output_length", "timestamp")  # each request's


class _Row(NamedTuple):
    """One request of a trace, checked: its hash ids, lengths (tokens) and arrival (ms)."""

    hash_ids: list[int]
    input_length: int
    output_length: int
    timestamp: float


def _read(path: Path, limit: int) -> list[_Row]:
    """The first ``limit`` requests of ``path`` (0: all); ConfigError naming the line of the
    first that is no request (a traceback before 2026-12-07, and at "line 1" of the wrong row)."""
    rows: list[_Row] = []
    try:
        with path.open() as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_row(line, number, path))
                    if len(rows) == limit:
                        break
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read Mooncake trace {path}: {exc}") from exc
    return rows


def _row(line: str, number: int, path: Path) -> _Row:
    where = f"Mooncake trace {path}, line {number}"
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: not an object")
    missing = [k for k in _FIELDS if k not in obj]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)}")
    ids = obj["hash_ids"]
    wholes = [_whole(h) for h in ids] if isinstance(ids, list) else [None]
    if not all(w is not None and w >= 0 for w in wholes):
        raise ConfigError(f"{where}: hash_ids must be a list of whole numbers >= 0")
    numbers = [_whole(obj[k]) for k in ("input_length", "output_length")]
    stamp = obj["timestamp"]
    if any(n is None or n < 0 for n in numbers) or not _finite(stamp):
        raise ConfigError(f"{where}: input_length and output_length must be whole numbers >= 0, "
                          "timestamp a number (ms)")  # fmt: skip
    return _Row([w or 0 for w in wholes], numbers[0] or 0, numbers[1] or 0, float(stamp))


def _whole(value: object) -> int | None:
    """``value`` as a whole number (``4834``, ``4834.0``, ``"4834"``), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int | float) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def build(config: MooncakeConfig, seed: int) -> Workload:
    path = data_file(config.path, f"traces/{config.trace}_trace.jsonl")
    rows = _read(path, config.limit)
    if not rows:
        raise ConfigError(f"trace {path} has no requests")
    rng = np.random.default_rng(seed)
    base = int(rng.integers(0, 2**31))  # seeds the ids; block of id h = base + h*bt + 0..bt-1
    bt = config.block_tokens
    ids = [np.asarray(row.hash_ids, dtype=np.int64) for row in rows]
    stride = 1 + max((int(a.max()) for a in ids if a.size), default=0)  # hash ids per copy
    # Prompt lengths without the prompts: tokens are made when a session is read (see _Prompts).
    lengths = [
        max(1, min(math.ceil(row.input_length * bt / TRACE_BLOCK), len(a) * bt))
        for row, a in zip(rows, ids, strict=True)
    ]
    outputs = [max(1, round(r.output_length * bt / TRACE_BLOCK)) for r in rows]
    trace_s = np.tile([r.timestamp / 1000 for r in rows], config.copies)
    jitter = rng.uniform(-config.jitter_s, config.jitter_s, len(trace_s))
    arrival = np.maximum(0.0, trace_s + jitter)
    arrival -= arrival.min()
    scale = config.time_scale
    if scale == 0:
        span = float(arrival.max())
        offered = sum(lengths) * config.copies / (config.load * config.capacity_tokens_per_s)
        scale = offered / span if span > 0 else 1.0
    order = np.argsort(arrival, kind="stable")
    offsets = np.arange(bt, dtype=np.int64)
    prompts = _Prompts(ids, lengths, outputs, stride, base, order, arrival * scale, offsets)
    return Workload(
        name="mooncake",
        sessions=SessionSource(len(order), prompts.session, len(order)),
        block_size=16,
        description=f"Mooncake {path.stem} replay: {len(rows)} requests"
        + (f" x {config.copies} copies" if config.copies > 1 else "")
        + f", {bt} tokens per hash id, time x{scale:.3g}",
    )


@dataclass(frozen=True, slots=True)
class _Prompts:
    """Builds the i-th session in arrival order from its trace row, copy and arrival time.

    Request ``k`` (before sorting) is row ``k % rows`` of copy ``k // rows``. Holding the rows'
    hash ids instead of 1,000,000 token arrays is what lets the scale run fit (about 3 GiB less).
    """

    ids: list[npt.NDArray[np.int64]]  # hash ids of each trace row
    lengths: list[int]  # scaled prompt length of each row, tokens
    outputs: list[int]  # scaled output length of each row, tokens
    stride: int  # hash ids per copy
    base: int  # seeded token id base
    order: npt.NDArray[np.intp]  # request numbers, by arrival
    start_s: npt.NDArray[np.float64]  # arrival of each request number, seconds
    offsets: npt.NDArray[np.int64]  # 0 .. tokens per hash id - 1, made once

    def session(self, i: int) -> Session:
        k = int(self.order[i])
        copy, row = divmod(k, len(self.ids))
        bt, n = len(self.offsets), self.lengths[row]
        hash_ids = self.ids[row][: -(-n // bt)] + copy * self.stride  # the blocks it reaches
        # Token ids base + h*bt + 0..bt-1, modulo 2**32: the cast to uint32 wraps (ids >= 0).
        blocks = (self.base + hash_ids * bt)[:, None] + self.offsets
        tokens = frozen(blocks.ravel()[:n].astype(np.uint32))
        return Session(
            session_id=f"row{k}",
            start_s=float(self.start_s[k]),
            turns=[Turn(tokens=tokens, output_tokens=self.outputs[row])],
        )
