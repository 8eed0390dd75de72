"""Building blocks shared by the generators: fresh token ids, arrivals, one-request sessions,
growing-prefix turns, and whole workloads of one-turn requests arriving as a Poisson process.

Token ids come from a counter that starts at a seeded random base. A counter makes distinct
content distinct by construction (random draws would collide now and then, which matters for the
token-exact seed workloads whose blocks are one token long), and the seeded base still makes two
seeds give different ids. Identical content (a shared system prompt) is one array reused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from prefixroute.sim.workload import Session, TokenArray, Turn, Workload

_ID_SPACE = 2**32  # token ids are uint32


class TokenSource:
    """Hands out token ids that were never handed out before in this workload."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._next = int(rng.integers(0, 2**31))  # next unused id (before wrapping), token id

    def fresh(self, n: int) -> TokenArray:
        """``n`` new token ids."""
        start = self._next
        self._next += n
        return (np.arange(start, start + n, dtype=np.uint64) % _ID_SPACE).astype(np.uint32)


def poisson_starts(rng: np.random.Generator, n: int, rate: float) -> npt.NDArray[np.float64]:
    """``n`` arrival times of a Poisson process of ``rate`` per second, the first at 0 seconds."""
    gaps = rng.exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def uniform_ints(rng: np.random.Generator, low: int, high: int, n: int) -> list[int]:
    """``n`` integers drawn uniformly from ``[low, high]`` (both ends included)."""
    return [int(x) for x in rng.integers(low, high + 1, n)]


def frozen(tokens: TokenArray) -> TokenArray:
    """Make ``tokens`` read-only: turns share prefixes as views, so nobody may write into them."""
    tokens.flags.writeable = False
    return tokens


def prefix_turns(
    tokens: TokenArray,
    ends: Sequence[int],
    outputs: Sequence[int],
    thinks: Sequence[float],
    texts: Sequence[str] | None = None,
) -> list[Turn]:
    """Turns whose prompts are ``tokens[:ends[k]]``.

    The prompts are views of one read-only array, so a conversation costs the memory of its last
    prompt only, and consecutive turns share an exact prefix by construction.
    """
    base = frozen(tokens)
    return [
        Turn(
            tokens=base[:end],
            output_tokens=max(1, int(out)),
            think_s=float(think) if k else 0.0,
            text=texts[k] if texts is not None else None,
        )
        for k, (end, out, think) in enumerate(zip(ends, outputs, thinks, strict=True))
    ]


def one_turn_sessions(
    requests: Iterable[tuple[float, TokenArray, int, str | None]], prefix: str = "req"
) -> list[Session]:
    """A session of one turn per request (start seconds, prompt tokens, output tokens, tenant),
    named ``{prefix}{i}`` in order; each prompt is made read-only (:func:`frozen`)."""
    return [
        Session(
            session_id=f"{prefix}{i}",
            start_s=float(start),
            turns=[Turn(tokens=frozen(tokens), output_tokens=output)],
            tenant=tenant,
        )
        for i, (start, tokens, output, tenant) in enumerate(requests)
    ]


def poisson_workload(
    name: str,
    rng: np.random.Generator,
    rate: float,
    requests: Sequence[tuple[TokenArray, int, str | None]],
    description: str,
) -> Workload:
    """The workload ``name`` of one-turn ``requests`` (prompt tokens, output tokens, tenant),
    in order, arriving as a Poisson process of ``rate`` per second; KV blocks of 16 tokens
    suggested. The arrivals are the last draws from ``rng``."""
    starts = poisson_starts(rng, len(requests), rate)
    sessions = one_turn_sessions(
        (start, tokens, output, tenant)
        for start, (tokens, output, tenant) in zip(starts, requests, strict=True)
    )
    return Workload(name=name, sessions=sessions, block_size=16, description=description)
