"""The emulated replica's settings: the engine model's, plus name, clock scale and address."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixroute.core import ConfigError
from prefixroute.events import EventEndpoint
from prefixroute.sim.fleet import SpeedChange
from prefixroute.sim.replica import ReplicaConfig


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    engine: ReplicaConfig = field(default_factory=ReplicaConfig)  # the simulated engine
    model: str = "emulated"  # model name served (``/v1/models``, ``model_name`` label)
    # LoRA adapters served beside the base model, by name (listed in ``/v1/models`` with the
    # base as ``parent``, as vLLM lists them): each caches its blocks apart from the base
    # model's and every other adapter's, as vLLM keys blocks by ``lora_name``.
    adapters: tuple[str, ...] = ()
    time_scale: float = 1.0  # wall seconds per model second; 0.1 runs 10x faster than real time
    host: str = "127.0.0.1"  # address to bind
    port: int = 0  # port to bind; 0 picks a free one
    hash_seed: int = 0  # seed of the engine's block hashes
    shutdown_timeout_s: float = 5.0  # graceful stop: how long in-flight requests may finish, s
    # Publish KV events as vLLM does: "bind:tcp://127.0.0.1:*", "connect:tcp://host:5557", or a
    # bare vLLM-style address (a wildcard host binds); optional ",replay=ADDR". None: no events.
    kv_events: str | None = None
    # Each KV event an array (SGLang's publisher, vLLM before its events became maps), not a
    # named-field map as vLLM 0.32 sends.
    kv_events_positional: bool = False
    # The engine's speed changes at these model times after it starts (their ``replica`` names
    # are not checked here: an :class:`EmulatedCluster` hands each replica its own).
    speed_changes: tuple[SpeedChange, ...] = ()
    # Every stream ends with a usage chunk, asked for or not (vLLM's --enable-force-include-usage);
    # False: only streams with stream_options.include_usage get one (vLLM's default).
    force_usage: bool = True
    # Context window, tokens (vLLM's --max-model-len, SGLang's --context-length): a longer
    # prompt gets the engine's 400. None: the KV cache's size, as /v1/models has always said.
    max_model_len: int | None = None

    @property
    def kv_events_endpoint(self) -> EventEndpoint | None:
        return EventEndpoint.for_publisher(self.kv_events) if self.kv_events else None

    def __post_init__(self) -> None:
        if not 0 < self.time_scale < math.inf:
            raise ConfigError(f"time scale must be positive and finite, got {self.time_scale}")
        if not self.model:
            raise ConfigError("the model name must not be empty")
        names = (self.model, *self.adapters)
        if not all(names) or len(set(names)) != len(names):
            raise ConfigError(
                "adapter names must be non-empty and differ from each other and from the model's"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max model length must be positive, got {self.max_model_len}")
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port out of range: {self.port}")
        _ = self.kv_events_endpoint  # a malformed spec fails here

    @property
    def window(self) -> int:
        """The context window, tokens (``max_model_len``, else the KV cache's size)."""
        engine = self.engine
        return self.max_model_len or engine.kv_capacity_blocks * engine.block_size
