"""``prefixroute bench``: replay a workload against a live deployment, scored like ``simulate``.

Two ways to run it:

* ``--url URL``: against a running gateway (or a single replica); one result row.
* no ``--url``: start ``--emulate N`` emulated replicas and one gateway per ``--policy`` in this
  process, all on 127.0.0.1, and compare the policies on the same workload. ``--fleet`` gives
  the replicas their own speeds (as ``simulate --fleet``), e.g. ``2+2:prefill=2500`` for a
  fleet whose second half prefills 4x slower; every policy meets fresh replicas of that fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from prefixroute.bench import APIS, ReplayConfig, ReplayResult, itl_percentiles, replay
from prefixroute.commands._args import (
    POLICY_PARAM_HELP,
    add_slo_argument,
    check_emulated,
    check_http_url,
    check_positive,
    check_slo,
    checked_policy_params,
    parse_pairs,
    seed,
)
from prefixroute.core import DEFAULT_POLICY, ConfigError, PrefixrouteError, parse_policy_list
from prefixroute.sim import (
    CHANGE_HELP,
    FLEET_HELP,
    Fleet,
    LazyProgress,
    PolicyMetrics,
    ReplicaConfig,
    ReplicaRecord,
    RunResult,
    Workload,
    check_plot_path,
    fleet_from_flags,
    make_console,
    make_workload,
    oracle_floor,
    print_report,
    summarize,
    write_json,
    write_plot,
)

PROBE_TIMEOUT_S = 10.0  # a --url that does not answer within this is reported dead, seconds
EMULATED_POLICIES = f"round_robin,cache_aware,{DEFAULT_POLICY}"  # compared without --url
EMULATED = 4  # emulated replicas without --url
SCALE_NOTED = 0.01  # replicas' tokens per workload token this far from 1 are said under the table
URL_KV_BLOCK = 16  # a live fleet's KV block size when not told, tokens (vLLM's default)


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="replay a workload against a live URL (or emulated replicas) and measure it",
        description=__doc__.replace("``", ""),  # plain text in --help, not reST
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", help="gateway or replica base URL; omit to run emulated replicas")
    p.add_argument("--label", default="live", help="row label for a --url run")
    p.add_argument("--model", help="the model field sent with each request")
    p.add_argument("--workload", "-w", default="seed-conversation", help="simulator workload")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a workload parameter (repeatable; see simulate --list)",
    )  # fmt: skip
    p.add_argument("--seed", type=seed, default=0, help="seed for the workload")
    p.add_argument(
        "--policy", "-p",
        help=f"policies to compare on emulated replicas (comma list; default "
        f"{EMULATED_POLICIES}; a --url gateway runs its own)",
    )  # fmt: skip
    p.add_argument(
        "--policy-param", action="append", default=[], metavar="POLICY.KEY=VALUE",
        help=POLICY_PARAM_HELP + "; emulated replicas only",
    )  # fmt: skip
    p.add_argument("--emulate", "-n", type=int, help=f"emulated replicas ({EMULATED}; no --url)")
    p.add_argument(
        "--fleet", metavar="SPEC",
        help=FLEET_HELP.replace("--replicas", "--emulate") + "; emulated replicas only",
    )  # fmt: skip
    p.add_argument(
        "--speed-change", action="append", default=[], metavar="REPLICA@SECONDS:KEY=VALUE",
        help=CHANGE_HELP + "; seconds of workload time after the replica starts",
    )  # fmt: skip
    p.add_argument(
        "--block-size", type=int,
        help="the replicas' KV block size, tokens: the emulated replicas' (default: the "
        f"workload's); with --url, what a stale prediction is judged in (default {URL_KV_BLOCK})",
    )  # fmt: skip
    p.add_argument("--kv-tokens", type=int, default=131_072, help="emulated KV cache, tokens")
    p.add_argument(
        "--time-scale", type=float, default=1.0,
        help="wall seconds per workload second (0.1 replays 10x faster; emulated replicas "
        "run 10x faster too, so reported times stay in workload seconds)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    p.add_argument(
        "--plain", type=float, default=0.0, metavar="SHARE",
        help="share of the requests sent without a stream, 0..1, drawn per request from "
        "--seed (their TTFT is not seen: TTFT and the SLO are over the streamed ones)",
    )  # fmt: skip
    p.add_argument(
        "--api", choices=sorted(APIS), default="completions",
        help="send each turn as an OpenAI completion (its text the prompt) or an Anthropic "
        "Messages request (its text one user message: /v1/messages, which vLLM serves)",
    )  # fmt: skip
    add_slo_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="write a TTFT CDF and load plot")
    p.set_defaults(run=run)


def _metrics(
    result: ReplayResult, floor: int | None, slo_s: float, requests: int | None = None
) -> PolicyMetrics:
    """The run's scores; the workload's floor is put in the replicas' tokens first, since
    prefill is counted from what they report (``ReplayResult.token_scale``). The floor counts
    all ``requests`` of the workload: where some failed or were never sent (a conversation
    stops at its first failed turn) the prefill of the rest is no ratio of it, and x floor is
    left out (it read 0.77: below the floor's definition). ``requests`` None: the run's own."""
    served = sum(1 for r in result.run.records if r.finish_s is not None)
    if result.errors or served < (len(result.run.records) if requests is None else requests):
        floor = None
    if floor is not None and result.token_scale is not None:
        floor = round(floor * result.token_scale)
    m = summarize(result.run, floor, slo_s)
    m.itl_ms = itl_percentiles(result.itl_s)
    m.errors = len(result.errors)
    return m


async def _reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail at once, in one line, when nothing answers at ``url`` (any HTTP answer will do)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.get(url.rstrip("/") + "/v1/models") as resp,
        ):
            await resp.read()
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        why = str(exc) or type(exc).__name__
        raise ConfigError(f"cannot reach {url}: {why}") from None


def _replay_config(
    args: argparse.Namespace, url: str, served: str | None = None
) -> ReplayConfig:
    """The replay's settings; ``served``: the model the emulated replicas serve, named in
    Messages requests when ``--model`` is not given (the Messages API requires one)."""
    model = args.model or (served if args.api == "messages" else None)
    if args.api == "messages" and model is None:
        raise ConfigError("--api messages needs --model: the Messages API requires a model")
    # Staleness is judged in the replicas' KV blocks: the emulated replicas' (--block-size, or
    # the workload's), or a live fleet's (--block-size, else vLLM's 16). At the workload's
    # block of 1, predictions a few tokens off within one block were counted stale.
    kv_block = args.block_size or (URL_KV_BLOCK if args.url else None)
    return ReplayConfig(
        url, model, args.time_scale, args.timeout, plain=args.plain, seed=args.seed,
        api=args.api, kv_block=kv_block,
    )  # fmt: skip


async def _run_url(args: argparse.Namespace, workload: Workload) -> list[ReplayResult]:
    cfg = _replay_config(args, args.url)
    await _reachable(args.url)
    bar = LazyProgress(workload.num_requests, f"{workload.name} -> {args.url}", True)
    try:
        return [await replay(workload, cfg, args.label, bar.update)]
    finally:
        bar.close()


async def _run_emulated(
    args: argparse.Namespace,
    workload: Workload,
    params: dict[str, dict[str, Any]],
    engine: ReplicaConfig,
    fleet: Fleet | None,
) -> list[ReplayResult]:
    # Imported here: a --url run needs neither the emulator nor the gateway.
    from prefixroute.emulate import EmulatorConfig, start_replicas
    from prefixroute.gateway import Gateway, GatewayConfig, normalize_url

    count = args.emulate if fleet is None else fleet.size
    results = []
    for policy in parse_policy_list(args.policy):
        emulator = EmulatorConfig(engine, time_scale=args.time_scale)
        cluster = await start_replicas(count, emulator, fleet)
        try:
            gw_cfg = GatewayConfig(
                port=0,
                replicas=tuple(cluster.urls),
                policy=policy,
                policy_params=params.get(policy, {}),
            )
            async with Gateway(gw_cfg) as gw:
                cfg = _replay_config(args, gw.url, emulator.model)
                bar = LazyProgress(workload.num_requests, f"{workload.name} / {policy}", True)
                try:
                    result = await replay(workload, cfg, policy, bar.update)
                finally:
                    bar.close()
                # The gateway names replicas by an opaque hash: name them r0, r1, ... in the
                # fleet's order instead (as --fleet and the simulator do).
                names = [gw.registry.public_name(normalize_url(url)) for url in cluster.urls]
            name_in_fleet_order(result.run, names)
            results.append(result)
        finally:
            await cluster.stop()
    return results


def name_in_fleet_order(run: RunResult, names: list[str]) -> None:
    """Rename ``run``'s replicas ``r0`` for ``names[0]`` and so on, in its records and its
    per-replica list, which then holds every replica of the fleet (0 for one sent nothing)."""
    ours = {n: f"r{i}" for i, n in enumerate(names)}
    for rec in run.records:
        rec.replica = ours.get(rec.replica, rec.replica)
    counts = {ours.get(r.replica, r.replica): r.requests for r in run.replicas}
    run.replicas = [ReplicaRecord(r, requests=counts.get(r, 0)) for r in ours.values()]


def _engine(args: argparse.Namespace, workload: Workload) -> ReplicaConfig:
    """The emulated replicas' engine settings (``--fleet`` groups override them)."""
    block = args.block_size or workload.block_size
    if args.kv_tokens < block:  # it was a one-block cache that refused every request
        raise ConfigError(
            f"--kv-tokens must hold at least one KV block ({block} tokens), got {args.kv_tokens}"
        )
    return ReplicaConfig(kv_capacity_blocks=args.kv_tokens // block, block_size=block)


def _fleet(args: argparse.Namespace, engine: ReplicaConfig) -> Fleet | None:
    """The per-replica settings of ``--fleet`` / ``--speed-change`` (None without either)."""
    if args.fleet is None and not args.speed_change:
        return None
    return fleet_from_flags(args.fleet, args.speed_change, args.emulate, engine)


def _check(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every flag checked before anything starts; returns the ``--policy-param`` settings."""
    if not 0 < args.time_scale < math.inf:
        raise ConfigError(f"--time-scale must be positive and finite, got {args.time_scale}")
    check_positive(args.timeout, "--timeout")  # else every request would time out at once
    if not 0.0 <= args.plain <= 1.0:
        raise ConfigError(f"--plain must be a share between 0 and 1, got {args.plain}")
    check_slo(args)
    if args.plot:  # else a format matplotlib lacks fails once the whole replay is over
        check_plot_path(args.plot)
    if args.block_size is not None and args.block_size < 1:
        raise ConfigError(f"--block-size must be at least 1, got {args.block_size}")
    if args.url is not None:  # one row, whatever the live gateway runs
        check_http_url(args.url, "--url")  # (an empty one ran emulated replicas instead)
        if urlsplit(args.url).path.rstrip("/").endswith("/v1"):
            raise ConfigError(f"--url is the base URL, without /v1 (bench adds /v1/...): "
                              f"{args.url!r}")  # fmt: skip
        # Silently unused, these made a run look like a comparison it was not.
        if args.policy is not None or args.policy_param:
            raise ConfigError("--policy and --policy-param set the emulated gateways' policies: "
                              "omit --url (a live gateway routes by its own; --label names it)")
        if args.emulate is not None or args.fleet is not None or args.speed_change:
            raise ConfigError("--emulate, --fleet and --speed-change set emulated replicas: "
                              "omit --url")  # fmt: skip
        return {}
    args.policy = EMULATED_POLICIES if args.policy is None else args.policy
    args.emulate = EMULATED if args.emulate is None else args.emulate
    check_emulated(args.emulate, "--emulate")
    return checked_policy_params(args.policy_param, parse_policy_list(args.policy))


def run(args: argparse.Namespace) -> int:
    params = _check(args)
    workload = make_workload(args.workload, args.seed, parse_pairs(args.overrides, "--set"))
    engine = _engine(args, workload)
    fleet = None if args.url else _fleet(args, engine)  # a bad spec: one line, before any start
    if args.url:
        results = asyncio.run(_run_url(args, workload))
    else:
        results = asyncio.run(_run_emulated(args, workload, params, engine, fleet))
    floor = oracle_floor(workload, args.block_size or workload.block_size)
    for r in results:
        if r.errors and not any(rec.finish_s is not None for rec in r.run.records):
            raise PrefixrouteError(
                f"every request failed ({r.run.policy}, {len(r.errors)} errors): {r.errors[0]}"
            )
    slo_s = args.slo_ttft_ms / 1000.0
    metrics = [_metrics(r, floor, slo_s, workload.num_requests) for r in results]
    target = args.url or _emulated_target(args.emulate, fleet)
    title = f"bench {workload.name}: {workload.num_requests:,} requests -> {target}"
    if args.json:
        scales = {r.run.policy: r.token_scale for r in results}
        meta = {"workload": workload.name, "target": target, "tokens_per_workload_token": scales}
        write_json(metrics, sys.stdout, meta)
    else:
        _print(metrics, results, title)
    if args.plot:
        ttfts = {
            r.run.policy: [x.ttft_s * 1000 for x in r.run.records if x.ttft_s is not None]
            for r in results
        }
        write_plot(metrics, ttfts, args.plot, title)
    return 1 if any(m.errors for m in metrics) else 0


def _emulated_target(count: int, fleet: Fleet | None) -> str:
    if fleet is not None:
        return f"emulated replicas behind the gateway ({fleet.describe()})"
    return f"{count} emulated replicas behind the gateway"


def _print(metrics: list[PolicyMetrics], results: list[ReplayResult], title: str) -> None:
    console = make_console()
    print_report(metrics, title, console, live=True)  # no sim-only columns
    for m in metrics:
        itl = m.itl_ms
        extra = f", ITL p50 {itl['p50']:.1f} ms p99 {itl['p99']:.1f} ms" if itl else ""
        console.print(f"{m.policy}: {m.errors} errors{extra}")
    for m in metrics:  # only when the gateway said (x-prefixroute-predicted-cached-tokens)
        if m.predicted_cached_tokens is not None:
            stale = "-" if m.stale_rate is None else f"{100 * m.stale_rate:.1f}%"
            console.print(
                f"{m.policy}: the gateway predicted {m.predicted_cached_tokens:,} cached "
                f"tokens; stale (a KV block or more fewer found than predicted): {stale}"
            )
    for r in results:
        if r.run.records and not r.cached_reported:
            console.print(
                f"{r.run.policy}: no answer reported its cached tokens "
                "(usage.prompt_tokens_details): prefill, cached, x floor and hit % are not "
                "measured (vLLM: --enable-prompt-tokens-details; SGLang: --enable-cache-report)"
            )
    scales = [r.token_scale for r in results if r.token_scale is not None]
    if scales and any(abs(x - 1.0) > SCALE_NOTED for x in scales):
        console.print(
            f"the replicas count {min(scales):.2f}-{max(scales):.2f} tokens per workload "
            "token: the oracle floor is scaled to their tokens (approximately: their "
            "blocks do not fall where the workload's do)"
        )
    for r in results:
        plain = sum(1 for rec in r.run.records if rec.plain)
        if plain:
            console.print(
                f"{r.run.policy}: {plain:,} requests asked for no stream: their first tokens "
                "are not seen, so TTFT and the SLO are over the streamed ones"
            )
    for r in results:
        for err in r.errors[:3]:
            console.print(f"  {r.run.policy}: {err}")
