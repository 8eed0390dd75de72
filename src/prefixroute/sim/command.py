"""``prefixroute simulate``: score routing policies on a workload in the simulator."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prefixroute.core import (
    DEFAULT_POLICY,
    ConfigError,
    make_policy,
    parse_policy_list,
    policy_names,
)
from prefixroute.sim.fleet import CHANGE_HELP, FLEET_HELP, Fleet, fleet_from_flags
from prefixroute.sim.metrics import DEFAULT_TTFT_SLO_S, PolicyMetrics
from prefixroute.sim.replica import ReplicaConfig
from prefixroute.sim.report import (
    make_console,
    markdown_table,
    print_report,
    write_json,
    write_plot,
)
from prefixroute.sim.runner import compare_policies
from prefixroute.sim.workloads import make_workload, workload_names, workload_params

DEFAULT_KV_TOKENS = 131_072  # KV cache per replica, tokens (8,192 blocks of 16)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="score routing policies on a workload (discrete-event simulation)",
        description="Simulate a cluster of replicas under one or more routing policies.",
    )
    add_replica_arguments(p)
    p.add_argument(
        "--workload", "-w", default="multi-turn", help="workload name, or 'all' (--list)"
    )
    p.add_argument(
        "--policy",
        "-p",
        default=DEFAULT_POLICY,
        help=f"policy or comma list; 'all' for every one (default {DEFAULT_POLICY}): "
        + ", ".join(policy_names()),
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload parameter (repeatable; --list shows them)",
    )
    p.add_argument(
        "--policy-param",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="policy parameter, e.g. cache_aware.cache_threshold=0.5 (repeatable)",
    )
    p.add_argument("--fleet", metavar="SPEC", help=FLEET_HELP)
    p.add_argument(
        "--speed-change",
        action="append",
        default=[],
        metavar="REPLICA@SECONDS:KEY=VALUE",
        help=CHANGE_HELP,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for workload and routing")
    p.add_argument(
        "--slo-ttft-ms", type=float, default=DEFAULT_TTFT_SLO_S * 1000,
        help="TTFT target of goodput, ms",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--markdown", action="store_true", help="print one markdown table")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="write TTFT CDF and load plot")
    p.add_argument("--list", action="store_true", help="list workloads and their parameters")
    p.set_defaults(run=run)


def add_replica_arguments(p: argparse.ArgumentParser) -> None:
    """Cluster and replica-model flags shared by ``simulate`` and ``demo``."""
    d = ReplicaConfig()
    p.add_argument("--replicas", "-n", type=int, default=4, help="replicas (default %(default)s)")
    p.add_argument("--block-size", type=int, help="KV block size, tokens (default: workload's)")
    p.add_argument("--kv-tokens", type=int, default=DEFAULT_KV_TOKENS, help="KV cache, tokens")
    p.add_argument("--prefill-rate", type=float, default=d.prefill_tokens_per_s, help="tokens/s")
    p.add_argument(
        "--decode-step-ms", type=float, default=d.decode_step_s * 1000, help="ms per decode step"
    )
    p.add_argument("--step-tokens", type=int, default=d.step_tokens, help="token budget/step")
    p.add_argument("--max-running", type=int, default=d.max_running, help="max batch, requests")


def replica_config_from(args: argparse.Namespace, block_size: int) -> ReplicaConfig:
    if block_size < 1:
        raise ConfigError(f"--block-size must be at least 1, got {block_size}")
    if args.replicas < 1:
        raise ConfigError("--replicas must be at least 1")
    if args.kv_tokens < block_size:
        raise ConfigError("--kv-tokens must hold at least one block")
    return ReplicaConfig(
        kv_capacity_blocks=args.kv_tokens // block_size,
        block_size=block_size,
        prefill_tokens_per_s=args.prefill_rate,
        decode_step_s=args.decode_step_ms / 1000.0,
        step_tokens=args.step_tokens,
        max_running=args.max_running,
    )


def fleet_from(args: argparse.Namespace, base: ReplicaConfig) -> Fleet | None:
    """The fleet of ``--fleet`` / ``--speed-change`` over ``base`` (None without either)."""
    if not (getattr(args, "fleet", None) or getattr(args, "speed_change", None)):
        return None
    return fleet_from_flags(args.fleet, args.speed_change, args.replicas, base)


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_policy_params(items: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_pairs(items, "--policy-param").items():
        policy, dot, field_name = key.partition(".")
        if not dot:
            raise ConfigError(f"--policy-param must look like POLICY.KEY=VALUE, got {key!r}")
        out.setdefault(policy, {})[field_name] = float(value) if "." in value else int(value)
    return out


def _print_list(console: Any) -> None:
    for name in workload_names():
        console.print(f"[bold]{name}[/bold]")
        for key, (typ, default, help_) in workload_params(name).items():
            console.print(f"  {key} ({typ.__name__}, default {default!r}): {help_}")


def run(args: argparse.Namespace) -> int:
    console = make_console()
    if args.list:
        _print_list(console)
        return 0
    names = policy_names() if args.policy == "all" else parse_policy_list(args.policy)
    try:
        params = parse_policy_params(args.policy_param)
    except ValueError as exc:
        raise ConfigError(f"bad --policy-param value: {exc}") from exc
    for policy, fields in params.items():
        if policy not in names:
            raise ConfigError(f"--policy-param names {policy!r}, which --policy does not run")
        make_policy(policy, **fields)  # unknown fields and bad values fail here, before running
    overrides = parse_pairs(args.overrides, "--set")
    workloads = workload_names() if args.workload == "all" else [args.workload]
    if len(workloads) > 1 and overrides:
        raise ConfigError("--set applies to one workload; name it with --workload")
    docs = []
    rows: list[PolicyMetrics] = []
    for name in workloads:
        workload = make_workload(name, args.seed, overrides)
        block_size = workload.block_size if args.block_size is None else args.block_size
        base = replica_config_from(args, block_size)
        fleet = fleet_from(args, base)
        replicas = args.replicas if fleet is None else fleet.size
        cmp = compare_policies(
            workload,
            names,
            replicas=replicas,
            replica_config=base,
            seed=args.seed,
            ttft_slo_s=args.slo_ttft_ms / 1000.0,
            policy_params=params,
            progress=sys.stderr.isatty() or not (args.json or args.markdown),
            fleet=fleet,
        )
        title = (
            f"{workload.name}: {workload.num_requests:,} requests, {replicas} replicas, "
            f"block {block_size}, seed {args.seed}"
        )
        if fleet is not None:
            title += f"\nfleet: {fleet.describe()}"
        rows.extend(cmp.metrics)
        header = cmp.json_header() | {"replicas": replicas}
        if fleet is not None:
            header["fleet"] = fleet.describe()
        docs.append(header | {"policies": cmp.metrics})
        if not (args.json or args.markdown):
            print_report(cmp.metrics, title, console)
        if args.plot:
            plot = (
                args.plot
                if len(workloads) == 1
                else args.plot.with_stem(f"{args.plot.stem}-{name}")
            )
            write_plot(cmp.metrics, cmp.ttfts_ms, plot, title)
            if not (args.json or args.markdown):
                console.print(f"plot written to {plot}")
    if args.json:
        if len(docs) == 1:
            doc = docs[0]
            write_json(doc.pop("policies"), sys.stdout, doc)
        else:
            json.dump(
                [d | {"policies": [m.to_json() for m in d["policies"]]} for d in docs],
                sys.stdout,
                indent=2,
            )
            sys.stdout.write("\n")
    if args.markdown:
        sys.stdout.write(markdown_table(rows))
    return 0
