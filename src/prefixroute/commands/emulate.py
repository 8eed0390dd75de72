"""``prefixroute emulate``: serve emulated replicas until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from prefixroute._serving import run_on_uvloop, wait_for_signal
from prefixroute.commands._args import bind_host, check_emulated
from prefixroute.emulate import EmulatedCluster, EmulatorConfig
from prefixroute.sim import CHANGE_HELP, FLEET_HELP, Fleet, ReplicaConfig, fleet_from_flags

log = logging.getLogger("prefixroute.emulate")


def add_parser(subparsers: Any) -> None:
    d = ReplicaConfig()
    p: argparse.ArgumentParser = subparsers.add_parser(
        "emulate",
        help="serve an emulated vLLM-like replica (OpenAI API, prefix cache, vLLM metrics)",
        description="Serve emulated replicas: the simulator's replica model in real time behind "
        "an OpenAI-compatible API, with usage.prompt_tokens_details.cached_tokens in every "
        "response and vLLM-named Prometheus metrics on /metrics. Streams always end with a "
        "usage chunk, as vLLM does with --enable-force-include-usage (--usage-when-asked: "
        "only when asked, vLLM's default).",
    )
    p.add_argument("--host", default="127.0.0.1", type=bind_host, help="address to bind")
    p.add_argument(
        "--port", type=int, default=8001, help="port; 0 = any free (default %(default)s)"
    )
    p.add_argument("--count", type=int, default=1, help="replicas on consecutive ports")
    p.add_argument("--model", default="emulated", help="model name served (default %(default)s)")
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="NAME",
        help="a LoRA adapter served beside the model, with its own cached blocks (repeatable)",
    )
    p.add_argument("--kv-blocks", type=int, default=d.kv_capacity_blocks, help="KV cache, blocks")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument(
        "--prefill-rate", type=float, default=d.prefill_tokens_per_s, help="prefill tokens/s"
    )
    p.add_argument(
        "--decode-step", type=float, default=d.decode_step_s, help="seconds per decode step"
    )
    p.add_argument(
        "--attention-tokens",
        type=float,
        default=d.attention_tokens,
        help="context tokens at which a prompt token's prefill costs double; 0 = attention is "
        "free (default %(default)s)",
    )
    p.add_argument("--step-tokens", type=int, default=d.step_tokens, help="token budget per step")
    p.add_argument("--max-running", type=int, default=d.max_running, help="max batch, requests")
    p.add_argument("--max-model-len", type=int, metavar="TOKENS", help="context window: a "
                   "longer prompt gets vLLM's 400 (default: the KV cache's size)")  # fmt: skip
    p.add_argument("--fleet", metavar="SPEC", help=FLEET_HELP.replace("--replicas", "--count"))
    p.add_argument(
        "--speed-change",
        action="append",
        default=[],
        metavar="REPLICA@SECONDS:KEY=VALUE",
        help=CHANGE_HELP + "; seconds of model time after the replica starts",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiply every duration (0.1 = ten times faster than real time)",
    )
    _add_protocol_args(p)
    p.set_defaults(run=run)


def _add_protocol_args(p: argparse.ArgumentParser) -> None:
    """What the replica says and publishes: block hashes, stream usage, KV events."""
    p.add_argument("--seed", type=int, default=0, help="block-hash seed")
    p.add_argument(
        "--usage-when-asked",
        action="store_true",
        help="a stream ends with a usage chunk only with stream_options.include_usage (vLLM's "
        "default); else always, as vLLM with --enable-force-include-usage",
    )
    p.add_argument(
        "--kv-events-endpoint",
        metavar="SPEC",
        help="publish KV events as vLLM does: bind:ADDR or connect:ADDR, or a vLLM-style address "
        "(tcp://*:5557 binds, tcp://host:5557 connects), optionally ,replay=ADDR; with --count, "
        "replica i uses port + i",
    )
    p.add_argument(
        "--kv-events-form",
        choices=("map", "array"),
        default="map",
        help="each KV event a named-field map, as vLLM sends (default), or an array, as SGLang "
        "and vLLM before its events became maps send",
    )


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    engine = ReplicaConfig(
        kv_capacity_blocks=args.kv_blocks,
        block_size=args.block_size,
        prefill_tokens_per_s=args.prefill_rate,
        decode_step_s=args.decode_step,
        attention_tokens=args.attention_tokens,
        step_tokens=args.step_tokens,
        max_running=args.max_running,
    )
    return EmulatorConfig(
        engine=engine,
        model=args.model,
        adapters=tuple(args.adapter),
        time_scale=args.time_scale,
        host=args.host,
        port=args.port,
        hash_seed=args.seed,
        kv_events=args.kv_events_endpoint,
        kv_events_positional=args.kv_events_form == "array",
        force_usage=not args.usage_when_asked,
        max_model_len=args.max_model_len,
    )


def fleet_from_args(args: argparse.Namespace, config: EmulatorConfig) -> Fleet | None:
    """The per-replica settings of ``--fleet`` / ``--speed-change`` (None without either)."""
    if args.fleet is None and not args.speed_change:
        return None
    return fleet_from_flags(args.fleet, args.speed_change, args.count, config.engine)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = config_from_args(args)
    fleet = fleet_from_args(args, config)
    count = args.count if fleet is None else fleet.size
    check_emulated(count, "--count" if fleet is None else "--fleet")
    if fleet is not None:
        log.info("fleet: %s", fleet.describe())
    run_on_uvloop(_serve(EmulatedCluster(count, config, fleet)))
    return 0


async def _serve(cluster: EmulatedCluster) -> None:
    await cluster.start()
    try:
        for replica in cluster.replicas:
            events = replica.kv_events_address
            log.info(
                "emulated replica serving %s%s",
                replica.url,
                f" (KV events {replica.config.kv_events} -> {events})" if events else "",
            )
        await wait_for_signal()
    finally:
        await cluster.stop()
