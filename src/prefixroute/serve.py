"""``prefixroute serve``: run the gateway until SIGINT/SIGTERM, then drain and stop.

With no replica given (flags or config file), it starts ``--emulate N`` emulated replicas in
this process and says so: the self-contained default that ``make demo`` can use. This command
module is the only part of the gateway package that knows the emulator exists.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any

from prefixroute._serving import run_until_signal, wait_for_signal
from prefixroute.core import DEFAULT_POLICY, policy_names
from prefixroute.emulate import EmulatedCluster, EmulatorConfig
from prefixroute.gateway import CONFIG_HELP, Gateway, GatewayConfig, build_config, load_toml

log = logging.getLogger("prefixroute.gateway")

TOKEN_ENV = "PREFIXROUTE_ADMIN_TOKEN"
UPSTREAM_KEY_ENV = "PREFIXROUTE_UPSTREAM_API_KEY"


def add_parser(subparsers: Any) -> None:
    d = GatewayConfig()
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the prefix-aware gateway in front of OpenAI-compatible replicas",
        description="An OpenAI-compatible gateway that routes each request to the replica "
        "most likely to hold its prefix (or per --policy). Settings come from flags, then "
        "--config, then defaults.",
        epilog=CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, help=f"port to bind (default {d.port})")
    p.add_argument(
        "--replica", action="append", dest="replicas", metavar="URL", help="replica base URL"
    )
    p.add_argument(
        "--policy", choices=policy_names(), help=f"routing policy (default {DEFAULT_POLICY})"
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file")
    token = p.add_mutually_exclusive_group()
    token.add_argument(
        "--admin-token-file",
        metavar="PATH",
        help=f"file holding the bearer token of /admin/* (or ${TOKEN_ENV})",
    )
    token.add_argument(
        "--admin-token",
        help="the token itself: avoid, every local user can read it in ps and /proc",
    )
    p.add_argument(
        "--upstream-api-key-file",
        metavar="PATH",
        help=f"file holding the key sent to the replicas (or ${UPSTREAM_KEY_ENV})",
    )
    p.add_argument("--admin-host", help="address of the admin listener (with --admin-port)")
    p.add_argument(
        "--admin-port", type=int, help="serve /admin/* on this port only, not on --port"
    )
    p.add_argument(
        "--log-bodies",
        action="store_true",
        default=None,
        help="debug only: log request and response bodies (prompt and completion text)",
    )
    p.add_argument(
        "--emulate",
        type=int,
        default=4,
        metavar="N",
        help="with no replicas given, start N emulated replicas in-process (default 4)",
    )
    p.add_argument("--emulate-time-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument(
        "--block-chars", type=int, help=f"characters per routing block ({d.block_chars})"
    )
    p.add_argument("--max-body-bytes", type=int, help=f"request body limit ({d.max_body_bytes})")
    p.add_argument("--max-in-flight", type=int, help=f"gateway in-flight cap ({d.max_in_flight})")
    p.add_argument(
        "--max-in-flight-per-replica",
        type=int,
        help=f"per-replica in-flight cap ({d.max_in_flight_per_replica})",
    )
    p.add_argument("--connect-timeout", type=float, dest="connect_timeout_s", help="seconds")
    p.add_argument(
        "--read-timeout", type=float, dest="read_timeout_s", help="upstream silence limit, s"
    )
    p.add_argument(
        "--health-interval", type=float, dest="health_interval_s", help="probe period, s"
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="local Hugging Face tokenizer dir (tokenizer.json, tokenizer_config.json): key "
        "requests by the engines' token ids in --kv-block-size blocks (never downloads)",
    )
    p.add_argument(
        "--kv-block-size",
        type=int,
        help=f"the replicas' KV block size, tokens (default {d.kv_block_size})",
    )
    p.add_argument(
        "--kv-events",
        action="append",
        metavar="URL=SPEC",
        help="precise mode: follow this replica's KV events; SPEC is bind:ADDR (engines connect "
        "to us: vLLM endpoint tcp://GATEWAY:PORT) or connect:ADDR (vLLM binds tcp://*:PORT), "
        "optionally ,replay=ADDR; once per replica; needs --tokenizer",
    )
    p.add_argument(
        "--speculative-ttl",
        type=float,
        dest="speculative_ttl_s",
        help=f"precise mode: seconds a routing decision counts as cached before its events "
        f"arrive (default {d.speculative_ttl_s})",
    )
    p.add_argument(
        "--sync-redis",
        metavar="URL",
        help="several instances: share routing decisions and load through this Redis "
        "(redis://HOST:PORT/DB); Redis down means local-only routing, not errors",
    )
    p.add_argument(
        "--sync-history",
        type=int,
        metavar="N",
        help=f"with --sync-redis in approximate mode: keep the last N decisions in Redis, so an "
        f"instance that starts or reconnects later begins warm (0: none; default {d.sync_history})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request (no text)")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Flags, then the environment, then the config file. Secrets come from files or the
    environment: the command line is visible to every local user (``/proc/PID/cmdline``)."""
    file_settings = load_toml(args.config) if args.config else {}
    token = args.admin_token
    if token is not None:
        log.warning(
            "--admin-token is visible to every local user in ps and /proc/PID/cmdline; "
            "use --admin-token-file or $%s",
            TOKEN_ENV,
        )
    elif args.admin_token_file is None:
        token = os.environ.get(TOKEN_ENV) or None
    upstream_key = None
    if args.upstream_api_key_file is None:
        upstream_key = os.environ.get(UPSTREAM_KEY_ENV) or None
    return build_config(
        file_settings,
        host=args.host,
        port=args.port,
        replicas=args.replicas,
        policy=args.policy,
        admin_token=token,
        admin_token_file=args.admin_token_file,
        upstream_api_key=upstream_key,
        upstream_api_key_file=args.upstream_api_key_file,
        block_chars=args.block_chars,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
        max_in_flight_per_replica=args.max_in_flight_per_replica,
        connect_timeout_s=args.connect_timeout_s,
        read_timeout_s=args.read_timeout_s,
        health_interval_s=args.health_interval_s,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        log_bodies=args.log_bodies,
        tokenizer=args.tokenizer,
        kv_block_size=args.kv_block_size,
        kv_events=args.kv_events,
        speculative_ttl_s=args.speculative_ttl_s,
        sync_redis=args.sync_redis,
        sync_history=args.sync_history,
    )


def run(args: argparse.Namespace) -> int:
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)  # errors (ConfigError) surface before anything starts
    run_until_signal(_serve(config, args.emulate, args.emulate_time_scale))
    return 0


async def _serve(config: GatewayConfig, emulate: int, time_scale: float) -> None:
    cluster: EmulatedCluster | None = None
    if not config.replicas:
        cluster = EmulatedCluster(emulate, EmulatorConfig(time_scale=time_scale))
        urls = await cluster.start()
        log.info("no replicas given: started %d emulated replicas: %s", emulate, ", ".join(urls))
        config = dataclasses.replace(config, replicas=tuple(urls))
    gateway = Gateway(config)
    try:
        url = await gateway.start()
        mode = "precise" if config.precise else "tokens" if config.tokenizer else "approximate"
        if config.sync_redis is not None:
            mode += f", sharing decisions through {config.sync_redis}"
        log.info(
            "gateway serving %s (policy %s, %d replicas, %s mode)",
            url,
            config.policy,
            len(config.replicas),
            mode,
        )
        if config.admin_port is not None:
            log.info("admin API on its own listener: %s", gateway.admin_url)
        await wait_for_signal()
    finally:
        await gateway.stop()  # drains up to shutdown_timeout_s, then cuts; logs both
        if cluster is not None:
            await cluster.stop()
