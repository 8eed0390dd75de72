"""Flag helpers more than one command uses: ``KEY=VALUE`` lists, ``--policy-param``, and the
simulated replica's flags (``simulate`` and ``demo``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from prefixroute.core import ConfigError, make_policy
from prefixroute.sim import DEFAULT_TTFT_SLO_S, ReplicaConfig, check_replica_count

DEFAULT_KV_TOKENS = 131_072  # KV cache per replica, tokens (8,192 blocks of 16)
MAX_EMULATED = 1_000  # emulated replicas one process serves, each on a port of its own
POLICY_PARAM_HELP = "policy parameter, e.g. cache_aware.cache_threshold=0.5 (repeatable)"


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """``KEY=VALUE`` strings as a dict; ConfigError naming ``what`` on a malformed one."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} must look like KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def flags(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags ``names`` as keyword arguments, for a config whose fields share their names."""
    return {name: getattr(args, name) for name in names}


def parse_policy_params(items: list[str]) -> dict[str, dict[str, Any]]:
    """``--policy-param POLICY.KEY=VALUE`` flags: policy -> {field: int or float}."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_pairs(items, "--policy-param").items():
        policy, dot, field_name = key.partition(".")
        if not dot:
            raise ConfigError(f"--policy-param must look like POLICY.KEY=VALUE, got {key!r}")
        out.setdefault(policy, {})[field_name] = policy_value(value, key)
    return out


def checked_policy_params(items: list[str], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``--policy-param`` flags for the policies ``names`` a command runs, each checked by
    building its policy, so that an unknown field or a bad value fails before any work."""
    params = parse_policy_params(items)
    names = list(names)
    for policy, fields in params.items():
        if policy not in names:
            raise ConfigError(f"--policy-param names {policy!r}, which --policy does not run")
        make_policy(policy, **fields)
    return params


def policy_value(value: str, name: str) -> int | float:
    """A ``--policy-param`` value for parameter ``name``: an int when it reads as one, else a
    float (``0.5``, ``1e4``); ConfigError naming ``name`` otherwise. NaN and infinity are
    refused: no policy weight or rate means anything at either, and NaN compares false with
    everything, so a policy would route on it silently."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(
            f"bad --policy-param value for {name}: {value!r} is not a number"
        ) from None
    if not math.isfinite(number):
        raise ConfigError(f"bad --policy-param value for {name}: {value!r} is not finite")
    return number


def seed(text: str) -> int:
    """An argparse type: a seed, a whole number of 0 or more (numpy's generators take no
    negative one: ``--seed -1`` ended in a traceback)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is 0 or more, got {value}")
    return value


def check_positive(value: float, flag: str) -> None:
    """ConfigError unless ``value`` is a finite number above zero (a timeout, an SLO): zero
    or less would fail every request, and argparse's ``float`` takes ``nan`` and ``inf``."""
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} must be a positive number, got {value:g}")


def check_emulated(count: int, flag: str) -> None:
    """ConfigError unless ``count`` emulated replicas, each a server on a port of this process,
    is 1 to ``MAX_EMULATED`` (``--emulate 100000`` would have bound as many ports)."""
    if not 1 <= count <= MAX_EMULATED:
        raise ConfigError(f"{flag} must be 1 to {MAX_EMULATED:,} replicas, got {count:,}")


def bind_host(value: str) -> str:
    """An address to bind (an argparse ``type``): not empty, which binds every interface
    (``--host "$UNSET"`` made a loopback-default server public)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an address to bind, not empty (it binds every interface)")
    return value


def check_http_url(url: str, flag: str) -> None:
    """ConfigError unless ``url`` is ``http(s)://host[:port][/prefix]``, so that a typo fails
    in one line before anything starts, not in urllib or aiohttp mid-run."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:  # a broken IPv6 host ("http://[::1")
        raise ConfigError(f"{flag} must be http(s)://host[:port], got {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{flag} must be http(s)://host[:port], got {url!r}")
    try:
        parts.port  # noqa: B018  (reading it checks it: a port out of range raises ValueError)
    except ValueError:
        raise ConfigError(f"{flag} has a bad port: {url!r}") from None
    if parts.query or parts.fragment:
        raise ConfigError(f"{flag} takes no query or fragment, got {url!r}")


def add_slo_argument(p: argparse.ArgumentParser) -> None:
    """``--slo-ttft-ms``: the goodput target of ``simulate`` and ``bench`` reports."""
    p.add_argument(
        "--slo-ttft-ms", type=float, default=DEFAULT_TTFT_SLO_S * 1000,
        help="TTFT target of goodput, ms",
    )  # fmt: skip


def add_jobs_argument(p: argparse.ArgumentParser) -> None:
    """``--jobs``: how many runs (a policy on a workload) ``simulate`` and ``demo`` make at
    once."""
    p.add_argument(
        "--jobs", "-j", type=int, default=0, metavar="N",
        help="runs (a policy on a workload) simulated at once, each in its own process (default "
        "0: one per usable CPU; 1: one after the other in this process). The results are the "
        "same either way",
    )  # fmt: skip


def check_jobs(args: argparse.Namespace) -> None:
    """``--jobs`` counts processes: 0 (as many as CPUs) or more."""
    if args.jobs < 0:
        raise ConfigError(f"--jobs must be 0 (one per CPU) or more, got {args.jobs}")


def check_slo(args: argparse.Namespace) -> None:
    """``--slo-ttft-ms`` must be a positive time: no request meets a target of zero or less."""
    check_positive(args.slo_ttft_ms, "--slo-ttft-ms")


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
    """The replica model of :func:`add_replica_arguments`' flags, at ``block_size``."""
    if block_size < 1:
        raise ConfigError(f"--block-size must be at least 1, got {block_size}")
    check_replica_count(args.replicas)
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
