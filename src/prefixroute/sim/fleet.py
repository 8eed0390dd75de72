"""Per-replica engine settings: a fleet that mixes hardware, and speeds that change mid-run.

A real fleet mixes GPU generations, parallelism and neighbours, so its replicas do not prefill
at one rate. A :class:`Fleet` gives replica ``r{i}`` its own :class:`ReplicaConfig` (prefill
rate, decode step, KV size, ...) and lists :class:`SpeedChange` events: at ``at_s`` a replica's
prefill rate and decode step become new values (another job took half its GPU), from its next
batch step on. The simulator and ``prefixroute emulate`` read the same fleet, so a heterogeneous
fleet is simulated, emulated and tested the same way.

The text form, for ``--fleet``, is groups joined by ``+``; a group is ``COUNT`` then optional
``:KEY=VALUE,...`` overrides of the base replica settings::

    2+2:prefill=2500                      # 4 replicas, r2 and r3 prefill 4x slower
    1:prefill=20000+3:decode_ms=30,kv_tokens=65536
    4:kv_tokens=16384,preempt=1           # small caches that preempt, as vLLM's do
    2+2:mixed=0                           # r2, r3 run prefill batches alone (SGLang's default)

and ``--speed-change`` is ``REPLICA@SECONDS:KEY=VALUE,...`` with keys ``prefill`` and
``decode_ms`` (``r1@60:prefill=2500``). A fleet of equal replicas runs exactly as the plain
``--replicas N`` cluster does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixroute.core import ConfigError, SpeedPrior
from prefixroute.sim.replica import ReplicaConfig, kv_blocks_needed

if TYPE_CHECKING:  # at run time the workload module would load numpy into the emulator
    from prefixroute.sim.workload import Workload

# --fleet key -> (ReplicaConfig field, multiplier from the flag's unit to the field's).
FLEET_KEYS: dict[str, tuple[str, float]] = {
    "prefill": ("prefill_tokens_per_s", 1.0),  # tokens/s
    "decode_ms": ("decode_step_s", 0.001),  # milliseconds per decode step
    "kv_tokens": ("kv_capacity_blocks", 1.0),  # KV cache, tokens (divided by the block size)
    "step_tokens": ("step_tokens", 1.0),  # token budget per step
    "max_running": ("max_running", 1.0),  # requests in the running batch
    "overhead_ms": ("first_token_overhead_s", 0.001),  # fixed time before the engine queues it
    "attention": ("attention_tokens", 1.0),  # context tokens at which a prompt token costs double
    "preempt": ("preempt", 1.0),  # 1: vLLM's on-demand KV blocks, preempting when they run out
    "mixed": ("mixed_batches", 1.0),  # 0: prefill batches run alone, as SGLang's by default
}
CHANGE_KEYS = ("prefill", "decode_ms")  # what a speed change may set
# A fleet's most replicas: 10x the largest run measured (docs/scale.md). 1e8 filled memory at
# 200 MB/s with no word; one simulation is one process.
MAX_REPLICAS = 10_000


def check_replica_count(count: int, flag: str = "--replicas") -> None:
    """ConfigError unless a fleet of ``count`` replicas (``flag`` says it) is 1 to
    ``MAX_REPLICAS``."""
    if not 1 <= count <= MAX_REPLICAS:
        raise ConfigError(f"{flag} must be 1 to {MAX_REPLICAS:,}, got {count:,}")

FLEET_HELP = (
    "per-replica settings: groups COUNT[:KEY=VALUE,...] joined by '+', keys "
    + ", ".join(FLEET_KEYS)
    + " (e.g. '2+2:prefill=2500': half the replicas prefill 4x slower); replaces --replicas"
)
CHANGE_HELP = (
    "a replica's speed changes at a time, REPLICA@SECONDS:KEY=VALUE,... with keys "
    + ", ".join(CHANGE_KEYS)
    + " (e.g. 'r1@60:prefill=2500'); repeatable"
)


@dataclass(frozen=True, slots=True)
class SpeedChange:
    """At ``at_s`` replica ``replica`` starts running at new speeds (None: unchanged)."""

    at_s: float  # seconds from the start of the run (model time)
    replica: str  # e.g. "r1"
    prefill_tokens_per_s: float | None = None  # new prefill rate, tokens/s
    decode_step_s: float | None = None  # new decode step, seconds

    def __post_init__(self) -> None:
        if not 0 <= self.at_s < math.inf:
            raise ConfigError(f"a speed change needs a finite time >= 0, got {self.at_s}")
        rate, step = self.prefill_tokens_per_s, self.decode_step_s
        if rate is not None and not 0 < rate < math.inf:
            raise ConfigError(f"a speed change's prefill rate must be positive and finite: {rate}")
        if step is not None and not 0 <= step < math.inf:
            raise ConfigError(f"a speed change's decode step must be >= 0 and finite: {step}")

    def apply(self, config: ReplicaConfig) -> ReplicaConfig:
        """``config`` with this change's speeds."""
        return SpeedPrior(self.prefill_tokens_per_s, self.decode_step_s).applied_to(config)


@dataclass(frozen=True, slots=True)
class Fleet:
    """Replica ``r{i}`` runs ``configs[i]``; ``changes`` alter speeds during the run."""

    configs: tuple[ReplicaConfig, ...]
    changes: tuple[SpeedChange, ...] = ()

    def __post_init__(self) -> None:
        if not self.configs:
            raise ConfigError("a fleet needs at least one replica")
        if len({c.block_size for c in self.configs}) > 1:
            raise ConfigError("every replica of a fleet must use the same KV block size")
        names = set(self.names)
        for ch in self.changes:
            if ch.replica not in names:
                raise ConfigError(
                    f"speed change for {ch.replica!r}, which the fleet does not have "
                    f"({', '.join(self.names)})"
                )

    @classmethod
    def uniform(cls, n: int, config: ReplicaConfig | None = None) -> Fleet:
        """``n`` replicas with the same settings."""
        if n < 1:
            raise ConfigError(f"a fleet needs at least one replica, got {n}")
        return cls((config or ReplicaConfig(),) * n)

    @property
    def size(self) -> int:
        return len(self.configs)

    @property
    def names(self) -> list[str]:
        return [f"r{i}" for i in range(len(self.configs))]

    def config_of(self, replica: str, default: ReplicaConfig) -> ReplicaConfig:
        """The settings of ``replica`` at the start (``default`` for one the fleet lacks, such
        as a replica a workload's cluster event adds)."""
        if replica.startswith("r") and replica[1:].isdigit():
            i = int(replica[1:])
            if i < len(self.configs):
                return self.configs[i]
        return default

    def with_changes(self, changes: Sequence[SpeedChange]) -> Fleet:
        return Fleet(self.configs, (*self.changes, *changes))

    def describe(self) -> str:
        """One line per distinct setting, e.g. ``r0-r1: 10,000 tok/s, 15 ms``."""
        parts: list[str] = []
        start = 0
        for i in range(1, len(self.configs) + 1):
            if i == len(self.configs) or self.configs[i] != self.configs[start]:
                c = self.configs[start]
                who = f"r{start}" if i - start == 1 else f"r{start}-r{i - 1}"
                overhead, attention = c.first_token_overhead_s, c.attention_tokens
                parts.append(
                    f"{who}: {c.prefill_tokens_per_s:,.0f} tok/s, "
                    f"{c.decode_step_s * 1000:g} ms/step, {c.kv_capacity_blocks * c.block_size:,}"
                    " KV tokens"
                    + (f", {overhead * 1000:g} ms before queueing" if overhead else "")
                    + (f", attention {attention:,.0f} tokens" if attention else "")
                    + ("" if c.mixed_batches else ", prefill alone")
                )
                start = i
        parts += [
            f"{ch.replica} at {ch.at_s:g} s: "
            + ", ".join(
                s
                for s in (
                    f"{ch.prefill_tokens_per_s:,.0f} tok/s" if ch.prefill_tokens_per_s else "",
                    f"{ch.decode_step_s * 1000:g} ms/step" if ch.decode_step_s is not None else "",
                )
                if s
            )
            for ch in self.changes
        ]
        return "; ".join(parts)


def _pairs(text: str, what: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            raise ConfigError(f"{what}: expected KEY=VALUE, got {item.strip()!r}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{what}: {key.strip()} needs a number, got {value!r}") from None
        if math.isinf(number):  # overhead_ms=inf: every request of the replica hung (NaNs
            # are refused by each key's own check, which names it)
            raise ConfigError(f"{what}: {key.strip()} needs a finite number, got {value!r}")
        out[key.strip()] = number
    return out


def _whole(key: str, value: float, least: int) -> int:
    """``value`` of an integer ``key``, refused unless a whole number of at least ``least``
    (``kv_tokens=1000.5`` was cut to 1,000 and ``kv_tokens=10`` to no block at all)."""
    if not math.isfinite(value) or value != int(value) or value < least:
        raise ConfigError(
            f"--fleet {key} must be a whole number of at least {least}, got {value:g}"
        )
    return int(value)


def parse_fleet(spec: str, base: ReplicaConfig) -> Fleet:
    """``"2+2:prefill=2500"`` -> a :class:`Fleet` (see the module docstring)."""
    if not spec.strip():
        raise ConfigError("--fleet is empty; give groups like 2+2:prefill=2500")
    configs: list[ReplicaConfig] = []
    for group in spec.split("+"):
        count_text, _, rest = group.strip().partition(":")
        try:
            count = int(count_text)
        except ValueError:
            raise ConfigError(
                f"--fleet group {group.strip()!r} must start with a replica count"
            ) from None
        if count < 1:
            raise ConfigError(f"--fleet group {group.strip()!r} needs a count of at least 1")
        if count + len(configs) > MAX_REPLICAS:
            raise ConfigError(f"--fleet describes more than {MAX_REPLICAS:,} replicas")
        config = base
        if rest.strip():
            changes: dict[str, float | int] = {}
            for key, value in _pairs(rest, "--fleet").items():
                if key not in FLEET_KEYS:
                    raise ConfigError(f"--fleet has no key {key!r}; valid: {', '.join(FLEET_KEYS)}")
                name, unit = FLEET_KEYS[key]
                if key == "kv_tokens":
                    changes[name] = _whole(key, value, base.block_size) // base.block_size
                elif name in ("step_tokens", "max_running"):
                    changes[name] = _whole(key, value, 1)
                elif key in ("preempt", "mixed"):
                    if value not in (0, 1):
                        raise ConfigError(f"--fleet {key} is 0 or 1, got {value:g}")
                    changes[name] = bool(value)
                else:
                    changes[name] = value * unit
            config = dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        configs += [config] * count
    return Fleet(tuple(configs))


def parse_speed_change(spec: str) -> SpeedChange:
    """``"r1@60:prefill=2500"`` -> a :class:`SpeedChange`."""
    head, sep, rest = spec.partition(":")
    replica, at, when = head.strip().partition("@")
    if not sep or not at or not replica:
        raise ConfigError(f"--speed-change must look like REPLICA@SECONDS:KEY=VALUE, got {spec!r}")
    try:
        at_s = float(when)
    except ValueError:
        raise ConfigError(f"--speed-change time must be a number, got {when!r}") from None
    values = _pairs(rest, "--speed-change")
    unknown = set(values) - set(CHANGE_KEYS)
    if unknown:
        raise ConfigError(
            f"--speed-change has no key {', '.join(sorted(unknown))}; "
            f"valid: {', '.join(CHANGE_KEYS)}"
        )
    decode = values.get("decode_ms")
    return SpeedChange(
        at_s,
        replica,
        prefill_tokens_per_s=values.get("prefill"),
        decode_step_s=None if decode is None else decode / 1000.0,
    )


def fleet_from_flags(
    fleet: str | None, changes: Sequence[str], replicas: int, base: ReplicaConfig
) -> Fleet:
    """The fleet that ``--fleet``, ``--speed-change`` and ``--replicas`` describe together."""
    if fleet is None:
        check_replica_count(replicas)
    built = parse_fleet(fleet, base) if fleet is not None else Fleet.uniform(replicas, base)
    return built.with_changes([parse_speed_change(c) for c in changes])


def check_cluster_events(workload: Workload, fleet: Fleet) -> None:
    """ConfigError for a cluster event of ``workload`` that would do nothing: a replica added
    while ``fleet`` has it, or removed while it has not (in time order). The simulator skipped
    them, so ``-n 8 --set add_replica_at_s=5`` (``r4`` is in such a fleet) ran as if unasked."""
    live = set(fleet.names)
    for event in sorted(workload.cluster_events, key=lambda e: e.at_s):
        if event.action == "add" and event.replica in live:
            raise ConfigError(f"{workload.name} adds replica {event.replica!r} at "
                              f"{event.at_s:g} s, which the fleet has then (name another)")
        if event.action == "remove" and event.replica not in live:
            raise ConfigError(f"{workload.name} removes replica {event.replica!r} at "
                              f"{event.at_s:g} s, which the fleet does not have then")
        (live.add if event.action == "add" else live.discard)(event.replica)


def check_fits(workload: Workload, fleet: Fleet, base: ReplicaConfig) -> None:
    """ConfigError when a request of ``workload`` needs more KV blocks (prompt and output)
    than a replica of ``fleet`` holds in all (``base``: a replica its cluster events add).

    The replica model refuses such a request whenever it is sent there (``RequestTooLarge``,
    by the same count); the simulator counts it failed and goes on, so a run where that is
    every request reads as NaN and zeros rather than the setting it is. Found before any run,
    in the words the replica refuses it with (``bench``'s emulated replicas: HTTP 400)."""
    check_cluster_events(workload, fleet)
    configs = list(fleet.configs)
    if any(e.action == "add" and e.replica not in fleet.names for e in workload.cluster_events):
        configs.append(base)
    small = min(range(len(configs)), key=lambda i: configs[i].kv_capacity_blocks)
    size, bs = configs[small].kv_capacity_blocks, configs[small].block_size
    who = f"replica r{small}" if small < fleet.size else "a replica the workload adds"
    for session in workload.sessions:
        for i, turn in enumerate(session.turns):
            needed = kv_blocks_needed(len(turn.tokens), turn.output_tokens, bs)
            if needed > size:
                raise ConfigError(
                    f"request {session.session_id}/{i} of {workload.name} needs {needed} KV "
                    f"blocks; {who} has {size} ({size * bs:,} tokens: set by --kv-tokens, or "
                    "kv_tokens in --fleet)"
                )
