"""``prefixroute serve``: run the gateway until SIGINT/SIGTERM, then drain and stop.

Its flags are ``GatewayConfig``'s fields (``_settings`` makes them from the field
declarations); the command adds ``--config``, ``--emulate`` and ``--verbose``. With no replica
given (flags or config file), it starts ``--emulate N`` emulated replicas in this process and
says so: the self-contained default that ``make demo`` can use. This module is the only place
where the gateway and the emulator meet.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any

from prefixroute._serving import on_signal, run_on_uvloop, wait_for_signal
from prefixroute.commands._args import check_emulated, parse_pairs, policy_value
from prefixroute.commands._settings import add_setting_flags, file_only_help, setting_values
from prefixroute.core import DEFAULT_POLICY, ConfigError
from prefixroute.emulate import EmulatedCluster, EmulatorConfig
from prefixroute.gateway import (
    ADMIN_TOKEN_ENV,
    CONFIG_HELP,
    SYNC_SECRET_ENV,
    UPSTREAM_API_KEY_ENV,
    Gateway,
    GatewayConfig,
    build_config,
    load_toml,
)
from prefixroute.sync import redacted

log = logging.getLogger("prefixroute.gateway")

TOKEN_ENV = ADMIN_TOKEN_ENV
UPSTREAM_KEY_ENV = UPSTREAM_API_KEY_ENV


def add_parser(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the prefix-aware gateway in front of OpenAI-compatible replicas",
        description="An OpenAI-compatible gateway that routes each request to the replica "
        "most likely to hold its prefix (or per --policy). Settings come from flags, then "
        "--config, then defaults.",
        epilog=CONFIG_HELP + "\n" + file_only_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file")
    add_setting_flags(p)
    p.add_argument(
        "--emulate",
        type=int,
        default=None,
        metavar="N",
        help="with no replicas given, start N emulated replicas in-process (default 4)",
    )
    p.add_argument("--emulate-time-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("-v", "--verbose", action="store_true", help="log every request (no text)")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """Flags, then the environment, then the config file. Secrets come from files or the
    environment: the command line is visible to every local user (``/proc/PID/cmdline``)."""
    file_settings = load_toml(args.config) if args.config else {}
    flags = setting_values(args)
    if flags["admin_token"] is not None:
        log.warning(
            "--admin-token is visible to every local user in ps and /proc/PID/cmdline; "
            "use --admin-token-file or $%s",
            TOKEN_ENV,
        )
    elif flags["admin_token_file"] is None:
        flags["admin_token"] = os.environ.get(TOKEN_ENV) or None
    if flags["upstream_api_key_file"] is None:
        flags["upstream_api_key"] = os.environ.get(UPSTREAM_KEY_ENV) or None
    if flags["sync_secret_file"] is None:
        flags["sync_secret"] = os.environ.get(SYNC_SECRET_ENV) or None
    policy = flags["policy"] or file_settings.get("policy", DEFAULT_POLICY)
    flags["policy_params"] = _policy_params(flags["policy_params"] or [], policy)
    return build_config(file_settings, **flags)


def _policy_params(items: list[str], policy: str) -> dict[str, Any] | None:
    """``--policy-param KEY=VALUE`` (or ``POLICY.KEY=VALUE`` naming the policy served)."""
    out: dict[str, Any] = {}
    for key, value in parse_pairs(items, "--policy-param").items():
        name, dot, field_name = key.rpartition(".")
        if dot and name != policy:
            raise ConfigError(f"--policy-param names {name!r}, but the gateway runs {policy!r}")
        out[field_name] = policy_value(value, field_name)
    return out or None


def run(args: argparse.Namespace) -> int:
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = config_from_args(args)  # errors (ConfigError) surface before anything starts
    # The app checks these too, but only once built: after the emulated replicas started.
    config.check_precise(config.tokenizer is not None)
    if config.kv_events and not config.replicas:
        why = "no replica is given (the emulated replicas publish no KV events)"
        raise ConfigError(f"kv_events name replicas, but {why}")
    if config.replica_speeds and not config.replicas:
        raise ConfigError("replica_speeds name replicas, but no replica is given")
    if args.emulate is not None and config.replicas:  # it was ignored without a word
        raise ConfigError("--emulate starts replicas of its own: give it or replicas, not both")
    emulate = 4 if args.emulate is None else args.emulate
    check_emulated(emulate, "--emulate")
    run_on_uvloop(_serve(config, emulate, args.emulate_time_scale))
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
            mode += f", sharing decisions through {redacted(config.sync_redis)}"  # no password
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
        on_signal(gateway.hurry)  # a second Ctrl-C cuts the drain short
        log.info("stopping: Ctrl-C again to cut the requests still running at once")
    finally:
        await gateway.stop()  # drains up to shutdown_timeout_s, then cuts; logs both
        if cluster is not None:
            await cluster.stop()
