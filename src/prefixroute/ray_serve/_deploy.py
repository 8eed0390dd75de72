"""Two helpers that put the pieces together: the router's config, and an emulated deployment.

``router_config`` checks the settings here, in the process that deploys, so a misspelt key
fails at ``serve.run`` time with our message instead of inside every handle's router later.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from prefixroute.core import DEFAULT_POLICY
from prefixroute.ray_serve._replica import EmulatedServeReplica
from prefixroute.ray_serve._settings import RouterSettings
from prefixroute.sim.replica import ReplicaConfig

ROUTER_CLASS = "prefixroute.ray_serve:PrefixRouteRequestRouter"  # import path Ray loads


def router_config(
    policy: str = DEFAULT_POLICY,
    policy_params: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Any:
    """A ``RequestRouterConfig`` for our router; ``settings`` are :class:`RouterSettings` fields.

    Returns Ray's ``RequestRouterConfig`` (typed Any here: ray is an optional dependency).
    """
    kwargs: dict[str, Any] = {"policy": policy, **settings}
    if policy_params:
        kwargs["policy_params"] = dict(policy_params)
    RouterSettings.from_kwargs(kwargs)  # fail now, with the list of valid names
    return RequestRouterConfig(request_router_class=ROUTER_CLASS, request_router_kwargs=kwargs)


def emulated_deployment(
    *,
    num_replicas: int = 4,
    request_router_config: Any = None,
    max_ongoing_requests: int = 16,
    engine: ReplicaConfig | None = None,
    time_scale: float = 1.0,
    name: str = "emulated",
) -> Any:
    """A bound Serve application of emulated replicas (pass it to ``serve.run``).

    ``request_router_config`` None keeps Ray's default router (PowerOfTwoChoices). Replicas ask
    for no CPU, so several fit on a laptop; each still runs in its own process.
    """
    options: dict[str, Any] = {
        "name": name,
        "num_replicas": num_replicas,
        "max_ongoing_requests": max_ongoing_requests,
        "ray_actor_options": {"num_cpus": 0},
    }
    if request_router_config is not None:
        options["request_router_config"] = request_router_config
    return serve.deployment(EmulatedServeReplica, **options).bind(engine, time_scale)
