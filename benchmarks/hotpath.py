"""The compiled hot path against the pure-Python one, measured in the same run (issue 15).

    .venv/bin/python benchmarks/hotpath.py           # ~10 seconds
    .venv/bin/python benchmarks/hotpath.py --quick   # a few seconds, a smaller index

Each backend runs in a child process of its own (``PREFIXROUTE_PURE_PYTHON=1`` for the Python
one: the switch is read once per process), one after the other, on the same seeded inputs:

* hashing: ``BlockHasher.hash_tokens`` over 8k- and 32k-token prompts, from scratch, as a
  numpy uint32 array and as a list; target >= 500M tokens/s;
* decisions: ``Router.route`` (predicted_ttft, the default policy) at 8k tokens, 16 replicas and
  an index of 1M blocks; the prompt is hashed beforehand, in ``Router.view``, and not timed;
  target p99 <= 100 µs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from prefixroute.core import BlockHasher, ReplicaId, Router, make_policy

REPLICAS = 16
BLOCK = 16  # tokens per block
PROMPT = 8_192  # tokens per routed prompt
SYSTEM = 2_048  # tokens of a prompt shared by many requests (one of 64 system prompts)
HASH_TARGET = 500e6  # tokens/s
ROUTE_TARGET_P99 = 100.0  # µs


def hashing(quick: bool) -> dict[str, float]:
    """Tokens per second, median of repeated runs, per prompt size and container."""
    rng = np.random.default_rng(0)
    hasher = BlockHasher(BLOCK)
    out = {}
    for n in (8_192, 32_768):
        tokens = rng.integers(0, 2**31, n, dtype=np.uint32)
        for kind, prompt in (("array", tokens), ("list", tokens.tolist())):
            reps = 20 if quick else 200
            times = []
            for _ in range(reps):
                t0 = time.perf_counter_ns()
                hasher.hash_tokens(prompt)
                times.append(time.perf_counter_ns() - t0)
            out[f"{n // 1024}k {kind}"] = n / (float(np.median(times)) / 1e9)
    return out


def filled_router(blocks: int, rng: np.random.Generator) -> tuple[Router, list[np.ndarray]]:
    """16 replicas whose index holds ``blocks`` blocks: 4k-token prompts (a shared system
    prompt and a random tail) routed round robin, through the router's public calls."""
    router = Router(make_policy("round_robin"), BlockHasher(BLOCK), seed=1)
    for i in range(REPLICAS):
        router.add_replica(ReplicaId(f"r{i}"))
    systems = [rng.integers(0, 2**31, SYSTEM, dtype=np.uint32) for _ in range(64)]
    per_part = SYSTEM // BLOCK
    i = 0
    # distinct blocks so far: every tail is new, each system prompt counts once
    while per_part * (i + min(i, len(systems))) < blocks:
        tail = rng.integers(0, 2**31, SYSTEM, dtype=np.uint32)
        view = router.view(f"fill{i}", tokens=np.concatenate([systems[i % len(systems)], tail]))
        router.route(view, now=0.0)
        router.complete(view.request_id, now=0.0)
        i += 1
    return router, systems


def decisions(quick: bool) -> dict[str, float]:
    rng = np.random.default_rng(7)
    blocks = 100_000 if quick else 1_000_000
    t0 = time.perf_counter()
    router, systems = filled_router(blocks, rng)
    fill_s = time.perf_counter() - t0
    router.policy = make_policy("predicted_ttft")
    count = 300 if quick else 3_000
    views = [
        router.view(
            f"req{k}",
            tokens=np.concatenate(
                [
                    systems[k % len(systems)],
                    rng.integers(0, 2**31, PROMPT - SYSTEM, dtype=np.uint32),
                ]
            ),
        )
        for k in range(count)
    ]
    gc.collect()  # the fill's garbage is not the decisions' cost
    times = []
    for k, view in enumerate(views):
        t0 = time.perf_counter_ns()
        router.route(view, now=float(k))
        times.append(time.perf_counter_ns() - t0)
        router.complete(view.request_id, now=float(k))
    p50, p99 = np.percentile(np.asarray(times) / 1000.0, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "blocks": float(blocks), "fill_s": fill_s}


def child(quick: bool) -> None:
    """One backend's numbers, as JSON on stdout."""
    result: dict[str, Any] = {}
    result["hashing"] = hashing(quick)
    result["route"] = decisions(quick)
    print(json.dumps(result))


def environment(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFIXROUTE_PURE_PYTHON"}
    if pure:
        env["PREFIXROUTE_PURE_PYTHON"] = "1"
    return env


def measure(pure: bool, quick: bool) -> dict[str, Any]:
    env = environment(pure)
    cmd = [sys.executable, __file__, "--child"] + (["--quick"] if quick else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def report(native: dict[str, Any], python: dict[str, Any]) -> None:
    # One line, only when the compiled path is not in use (the line make install prints).
    said = subprocess.run(
        [sys.executable, "-m", "prefixroute.core._native"],
        env=environment(False),
        capture_output=True,
        text=True,
    ).stdout.strip()
    if said:
        print(f"  {said}: both columns are pure Python")
    print("## hashing, BlockHasher.hash_tokens, block 16 (M tokens/s, median)")
    print(f"  {'prompt':<10} {'compiled':>10} {'python':>10} {'ratio':>7}")
    for key, fast in native["hashing"].items():
        slow = python["hashing"][key]
        print(f"  {key:<10} {fast / 1e6:>10.0f} {slow / 1e6:>10.0f} {fast / slow:>6.1f}x")
    best = native["hashing"]["8k array"]
    verdict = "met" if best >= HASH_TARGET else "MISSED"
    print(f"  target >= {HASH_TARGET / 1e6:.0f}M tokens/s (8k array): {verdict}")
    n, p = native["route"], python["route"]
    print(
        f"\n## Router.route, predicted_ttft, {PROMPT // 1024}k tokens, {REPLICAS} replicas, "
        f"{n['blocks']:,.0f} indexed blocks (µs)"
    )
    print(f"  {'':<10} {'compiled':>10} {'python':>10} {'ratio':>7}")
    for q in ("p50", "p99"):
        print(f"  {q:<10} {n[q]:>10.1f} {p[q]:>10.1f} {p[q] / n[q]:>6.1f}x")
    print(f"  {'fill (s)':<10} {n['fill_s']:>10.2f} {p['fill_s']:>10.2f}")
    verdict = "met" if n["p99"] <= ROUTE_TARGET_P99 else "MISSED"
    print(f"  target p99 <= {ROUTE_TARGET_P99:.0f} µs: {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds: smaller index")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child:
        child(args.quick)
        return
    report(measure(False, args.quick), measure(True, args.quick))


if __name__ == "__main__":
    main(sys.argv[1:])
