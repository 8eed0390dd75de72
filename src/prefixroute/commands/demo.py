"""``prefixroute demo``: a tour of the article's two worked examples and one larger run."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.rule import Rule

from prefixroute.commands._args import (
    add_jobs_argument,
    add_replica_arguments,
    check_jobs,
    replica_config_from,
    seed,
)
from prefixroute.core import DEFAULT_POLICY
from prefixroute.sim import (
    check_plot_path,
    check_replica_count,
    compare_policies,
    make_console,
    make_workload,
    print_report,
    write_plot,
)
from prefixroute.sim.workloads import check_workload

BASELINES = ("round_robin", "least_loaded")
LARGE_POLICIES = ("round_robin", "least_loaded", "cache_aware", "prefix_affinity", DEFAULT_POLICY)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="walk through the article's worked examples and a larger simulated workload",
    )
    add_replica_arguments(p)
    p.add_argument("--large", default="multi-turn", help="the larger workload (default multi-turn)")
    p.add_argument("--plot", type=Path, default=Path("out/demo.png"), help="plot of the large run")
    p.add_argument("--seed", type=seed, default=0, help="seed for workloads and routing")
    add_jobs_argument(p)  # the large run's policies; the worked examples take milliseconds
    p.set_defaults(run=run, replicas=5)


def _say(console: Any, title: str, text: str) -> None:
    console.print(Rule(title))
    console.print(text.strip() + "\n")


def run(args: argparse.Namespace) -> int:
    check_jobs(args)
    check_plot_path(args.plot)  # before the demo runs, not once it is over
    check_workload(args.large)  # before the worked examples print (58 lines of them)
    check_replica_count(args.replicas)  # the large run's; before the examples print
    if args.block_size is not None:  # the large run's, as above (at least 1, --kv-tokens' room)
        replica_config_from(args, args.block_size)
    console = make_console()
    _conversation(args, console)
    _shared_prompt(args, console)
    _large(args, console)
    return 0


def _conversation(args: argparse.Namespace, console: Any) -> None:
    conv = make_workload("seed-conversation", args.seed)
    cfg = replica_config_from(args, conv.block_size)
    rate = cfg.prefill_tokens_per_s  # --prefill-rate's (the article's 10,000 by default)
    _say(
        console,
        "1. One five-turn conversation, five replicas (the article's; --replicas sizes part 3)",
        f"""
Each turn resends the whole history: 400, 700, 1,000, 1,400, then 1,700 prompt tokens.
Round-robin sends every turn to a different replica, which recomputes the whole prompt.
The prefix-aware default policy keeps the conversation where its history is cached.
Prefill runs at {rate:,.0f} tokens/s, so 1,700 tokens cost {1700 / rate * 1e3:,.0f} ms and 300 new \
tokens {300 / rate * 1e3:,.0f} ms.
""",
    )
    cmp = compare_policies(conv, ["round_robin", DEFAULT_POLICY], replicas=5, replica_config=cfg,
                           seed=args.seed)  # fmt: skip
    print_report(cmp.metrics, "seed-conversation (token-exact, block size 1)", console)
    rr, ours = cmp.metrics
    console.print(
        f"\n=> {rr.prefill_tokens:,} vs {ours.prefill_tokens:,} prompt tokens computed "
        f"({1 - ours.prefill_tokens / rr.prefill_tokens:.0%} less); whole conversation "
        f"{rr.ttft_total_ms:.0f} ms vs {ours.ttft_total_ms:.0f} ms of time to first token.\n"
    )


def _shared_prompt(args: argparse.Namespace, console: Any) -> None:
    _say(
        console,
        "2. Fifty users sharing a 200-token system prompt, five replicas",
        """
The first request on each replica computes the system prompt; every later one reuses it.
With 10 users per replica, 45 of the 50 requests skip 200 tokens each: 9,000 tokens saved.
""",
    )
    shared = make_workload("seed-shared-prompt", args.seed)
    cfg = replica_config_from(args, shared.block_size)
    cmp = compare_policies(shared, [*BASELINES, DEFAULT_POLICY], replicas=5, replica_config=cfg,
                           seed=args.seed)  # fmt: skip
    print_report(cmp.metrics, "seed-shared-prompt (token-exact, block size 1)", console)
    ours = cmp.metrics[-1]
    console.print(
        f"\n=> {DEFAULT_POLICY}: {ours.cached_tokens:,} tokens reused, requests per replica "
        f"{list(ours.per_replica_requests.values())}.\n"
    )


def _large(args: argparse.Namespace, console: Any) -> None:
    large = make_workload(args.large, args.seed)
    _say(
        console,
        f"3. A larger workload: {large.name}",
        f"""
{large.description}
{large.num_requests:,} requests on {args.replicas} replicas. Watch p99 TTFT: cache affinity
alone makes hot spots, load balance alone recomputes shared prefixes; {DEFAULT_POLICY} weighs
both as predicted time to first token.
""",
    )
    # --block-size is the large run's: the worked examples are token-exact (block 1) by design.
    block_size = large.block_size if args.block_size is None else args.block_size
    cfg = replica_config_from(args, block_size)
    cmp = compare_policies(  # the same seed as the workload's: as simulate --seed
        large, LARGE_POLICIES, replicas=args.replicas, replica_config=cfg, jobs=args.jobs,
        seed=args.seed,
    )  # fmt: skip
    title = f"{large.name}: {large.num_requests:,} requests, {args.replicas} replicas"
    if block_size != large.block_size:
        title += f", block {block_size}"
    print_report(cmp.metrics, title, console)
    plot = write_plot(cmp.metrics, cmp.ttfts_ms, args.plot, title)
    console.print(f"\nplot written to {plot}")
    exe = command_name(sys.argv[0])
    console.print(f"Next: `{exe} simulate --list`, then `{exe} simulate -w hot-prefix -p all`.")


def command_name(argv0: str) -> str:
    """How the user ran us, to repeat in hints: the script's own path (``make demo`` runs
    ``.venv/bin/prefixroute``, which is not on PATH), else the bare name."""
    return argv0 if os.path.basename(argv0) == "prefixroute" else "prefixroute"
