"""The router's settings, read from ``request_router_kwargs`` and checked before any request.

Ray passes ``RequestRouterConfig.request_router_kwargs`` (JSON values only) to
``initialize_state``. The defaults are the gateway's (``prefixroute serve``), so a policy behaves
the same behind Ray as behind the gateway. A misspelt key or an unknown policy raises
:class:`~prefixroute.core.ConfigError` naming the valid ones, rather than being ignored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixroute.core import DEFAULT_POLICY, BlockHasher, ConfigError, Router, make_policy
from prefixroute.ray_serve._ledger import Ledger
from prefixroute.sync import check_url


@dataclass(frozen=True, slots=True)
class RouterSettings:
    policy: str = DEFAULT_POLICY  # registry name (prefixroute.core.POLICIES)
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # config fields of the policy
    block_chars: int = 64  # characters (or token ids) per routing block
    index_capacity_blocks: int | None = 16384  # prefix-index entries per replica, blocks
    kv_block_size: int = 16  # tokens per engine KV block, for the load view's block counts
    seed: int = 0  # the policy's random choices (ties, power of two)
    # Replicas' prefill rate, tokens/s, to predict each request's first token, which Ray never
    # shows a router (see _ledger); None counts a request as prefilling until it completes.
    prefill_tokens_per_s: float | None = 10_000.0
    # Several routers, one view: share decisions and load through this Redis, as the gateway's
    # --sync-redis does (docs/deployment.md). Routers of one deployment only: the replicas are
    # named by Ray's replica ids, which gateways and pickers (URLs) do not share.
    sync_redis: str | None = None  # redis://HOST:PORT/DB; None: this router's own view only
    sync_channel: str = "prefixroute:routed"  # Redis PUB/SUB channel, one per router fleet
    sync_history: int = 4096  # decisions kept in Redis for routers that start later; 0: none

    def __post_init__(self) -> None:
        if not isinstance(self.policy_params, Mapping):
            raise ConfigError("policy_params must be a mapping of field name to value")
        for name in ("block_chars", "kv_block_size", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an integer, got {value!r}")
        if self.block_chars < 1 or self.kv_block_size < 1:
            raise ConfigError("block_chars and kv_block_size must be at least 1")
        cap = self.index_capacity_blocks
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ConfigError("index_capacity_blocks must be a positive integer (or None)")
        rate = self.prefill_tokens_per_s
        if rate is not None and (
            not isinstance(rate, int | float) or isinstance(rate, bool) or not 0 < rate < math.inf
        ):  # (NaN passed "<= 0": every first-token guess was then due at NaN seconds)
            raise ConfigError("prefill_tokens_per_s must be a positive finite number (or None)")
        self._check_sync()
        make_policy(self.policy, **self.policy_params)  # unknown names and fields fail here

    def _check_sync(self) -> None:
        url, history = self.sync_redis, self.sync_history
        if url is not None and not isinstance(url, str):
            raise ConfigError(f"sync_redis must be a redis:// URL, got {url!r}")
        if url is not None:
            check_url(url)  # a URL redis-py cannot use fails here, not at the first request
        if not isinstance(self.sync_channel, str) or not self.sync_channel:
            raise ConfigError("sync_channel must be a non-empty string")
        if not isinstance(history, int) or isinstance(history, bool) or history < 0:
            raise ConfigError(f"sync_history must be an integer, 0 or more, got {history!r}")

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> RouterSettings:
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - valid)
        if unknown:
            raise ConfigError(
                f"prefixroute router: unknown request_router_kwargs {', '.join(unknown)}; "
                f"valid: {', '.join(sorted(valid))}"
            )
        return cls(**kwargs)

    def build_ledger(self) -> Ledger:
        """The router and the bookkeeping of Ray's hooks around it."""
        return Ledger(self.build_router(), prefill_tokens_per_s=self.prefill_tokens_per_s)

    def build_router(self) -> Router:
        """A core Router in approximate (character-hash) mode, as the gateway builds one."""
        return Router(
            make_policy(self.policy, **self.policy_params),
            BlockHasher(self.block_chars),
            index_capacity_blocks=self.index_capacity_blocks,
            kv_block_size=self.kv_block_size,
            seed=self.seed,
        )
