"""``prefixroute simulate``: score routing policies on a workload in the simulator."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from prefixroute.commands._args import (
    POLICY_PARAM_HELP,
    add_jobs_argument,
    add_replica_arguments,
    add_slo_argument,
    check_jobs,
    check_slo,
    checked_policy_params,
    parse_pairs,
    replica_config_from,
    seed,
)
from prefixroute.core import DEFAULT_POLICY, ConfigError, parse_policy_list, policy_names
from prefixroute.sim import (
    CHANGE_HELP,
    FLEET_HELP,
    Comparison,
    ComparisonPlan,
    Fleet,
    PolicyMetrics,
    ReplicaConfig,
    Workload,
    check_fits,
    check_plot_path,
    fleet_from_flags,
    make_console,
    make_workload,
    markdown_table,
    plan_comparison,
    print_report,
    run_comparisons,
    workload_names,
    workload_params,
    write_json,
    write_plot,
)


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
        help=POLICY_PARAM_HELP,
    )
    p.add_argument("--fleet", metavar="SPEC", help=FLEET_HELP)
    p.add_argument(
        "--speed-change",
        action="append",
        default=[],
        metavar="REPLICA@SECONDS:KEY=VALUE",
        help=CHANGE_HELP,
    )
    p.add_argument(
        "--learn-ttft-overhead",
        action="store_true",
        help="the router learns each replica's fixed first-token overhead too (the gateway's "
        "learn_ttft_overhead; see --fleet's overhead_ms)",
    )
    _add_what_the_router_sees(p)
    p.add_argument("--seed", type=seed, default=0, help="seed for workload and routing")
    add_jobs_argument(p)
    add_slo_argument(p)
    output = p.add_mutually_exclusive_group()  # each replaces the tables on stdout
    output.add_argument("--json", action="store_true", help="print JSON instead of tables")
    output.add_argument("--markdown", action="store_true", help="print one markdown table")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="write TTFT CDF and load plot")
    p.add_argument("--list", action="store_true", help="list workloads and their parameters")
    p.set_defaults(run=run)


def _add_what_the_router_sees(p: argparse.ArgumentParser) -> None:
    """``--plain``, ``--scrape`` and ``--tell-speeds``: what the router is told of the answers
    and the engines."""
    plain = "share of the answers that are plain, not streamed (0 to 1; default 0): the router "
    plain += "sees no first token of those, only their end, as a gateway does"
    p.add_argument("--plain", type=float, default=0.0, metavar="SHARE", help=plain)
    p.add_argument(
        "--scrape", type=float, default=0.0, metavar="SECONDS",
        help="the router reads each engine's prefill metrics this often, as a gateway's health "
        "round does (default 0: never)",
    )  # fmt: skip
    p.add_argument(
        "--tell-speeds", action="store_true",
        help="give the router each replica's true prefill rate, decode step and batch size "
        "(max_running) as its own priors, as serve's --replica-speed does (default: it learns "
        "them)",
    )  # fmt: skip


def fleet_from(args: argparse.Namespace, base: ReplicaConfig) -> Fleet | None:
    """The fleet of ``--fleet`` / ``--speed-change`` over ``base`` (None without either)."""
    if getattr(args, "fleet", None) is None and not getattr(args, "speed_change", None):
        return None
    return fleet_from_flags(args.fleet, args.speed_change, args.replicas, base)


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
    params = checked_policy_params(args.policy_param, names)  # fails before any run
    check_slo(args)
    check_jobs(args)
    if not 0.0 <= args.plain <= 1.0:  # nan too
        raise ConfigError(f"--plain is a share between 0 and 1, got {args.plain}")
    if not 0.0 <= args.scrape < float("inf"):  # nan too
        raise ConfigError(f"--scrape is 0 (never) or a number of seconds, got {args.scrape}")
    if args.plot:
        check_plot_path(args.plot)
    overrides = parse_pairs(args.overrides, "--set")
    workloads = workload_names() if args.workload == "all" else [args.workload]
    if len(workloads) > 1 and overrides:
        raise ConfigError("--set applies to one workload; name it with --workload")
    # Every workload is built and checked against its replicas before the first one runs.
    setups = [_setup(args, make_workload(name, args.seed, overrides)) for name in workloads]
    plans = [_plan(args, setup, names, params) for setup in setups]
    comparisons = run_comparisons(
        plans,
        ttft_slo_s=args.slo_ttft_ms / 1000.0,
        progress=sys.stderr.isatty() or not (args.json or args.markdown),
        jobs=args.jobs,
    )
    docs = []
    rows: list[PolicyMetrics] = []
    for setup, cmp in zip(setups, comparisons, strict=True):  # each as its runs are done
        doc = _report(args, setup, cmp, console, len(workloads) > 1)
        rows.extend(doc["policies"])
        docs.append(doc)
    if args.json:
        _print_json(docs)
    if args.markdown:
        sys.stdout.write(markdown_table(rows))
    return 0


_Setup = tuple[Workload, ReplicaConfig, Fleet | None]


def _setup(args: argparse.Namespace, workload: Workload) -> _Setup:
    """The workload with its base replica and fleet; ConfigError if a request of it can never
    fit a replica's KV cache (the run would only count it failed)."""
    block_size = workload.block_size if args.block_size is None else args.block_size
    base = replica_config_from(args, block_size)
    fleet = fleet_from(args, base)
    check_fits(workload, fleet or Fleet.uniform(args.replicas, base), base)
    return workload, base, fleet


def _plan(
    args: argparse.Namespace,
    setup: _Setup,
    names: list[str],
    params: dict[str, dict[str, Any]],
) -> ComparisonPlan:
    """Every policy's run on one workload."""
    workload, base, fleet = setup
    return plan_comparison(
        workload,
        names,
        replicas=args.replicas if fleet is None else fleet.size,
        replica_config=base,
        seed=args.seed,
        policy_params=params,
        fleet=fleet,
        learn_overhead=args.learn_ttft_overhead,
        plain=args.plain,
        scrape_s=args.scrape,
        tell_speeds=args.tell_speeds,
    )


def _report(
    args: argparse.Namespace, setup: _Setup, cmp: Comparison, console: Any, several: bool
) -> dict[str, Any]:
    """One workload's comparison: its report (or plot), and its JSON document."""
    workload, base, fleet = setup
    name, block_size = workload.name, base.block_size
    replicas = args.replicas if fleet is None else fleet.size
    tables = not (args.json or args.markdown)
    title = (
        f"{workload.name}: {workload.num_requests:,} requests, {replicas} replicas, "
        f"block {block_size}, seed {args.seed}"
    )
    header = cmp.json_header() | {"replicas": replicas}
    if fleet is not None:
        title += f"\nfleet: {fleet.describe()}"
        header["fleet"] = fleet.describe()
    if tables:
        print_report(cmp.metrics, title, console)
    if args.plot:
        plot = args.plot.with_stem(f"{args.plot.stem}-{name}") if several else args.plot
        plot = write_plot(cmp.metrics, cmp.ttfts_ms, plot, title)
        if tables:
            console.print(f"plot written to {plot}")
    return header | {"policies": cmp.metrics}


def _print_json(docs: list[dict[str, Any]]) -> None:
    if len(docs) == 1:
        doc = docs[0]
        write_json(doc.pop("policies"), sys.stdout, doc)
        return
    json.dump(
        [d | {"policies": [m.to_json() for m in d["policies"]]} for d in docs],
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")
