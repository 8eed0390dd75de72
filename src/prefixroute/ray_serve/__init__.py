"""Ray Serve integration: our policies as a Serve request router, and emulated Serve replicas.

Swap it in for Ray's ``PrefixCacheAffinityRouter`` by configuration alone::

    from ray import serve
    from ray.serve.config import RequestRouterConfig

    @serve.deployment(request_router_config=RequestRouterConfig(
        request_router_class="prefixroute.ray_serve:PrefixRouteRequestRouter",
        request_router_kwargs={"policy": "predicted_ttft"},   # optional; RouterSettings fields
    ))
    class MyLLM: ...

The router reads each request's prompt where Ray's does (an argument's ``messages`` or
``prompt``, as an attribute or a dict key), so the same deployment runs under either router.
Try it with no GPU: :func:`emulated_deployment` deploys replicas that each run an emulated
engine with its own KV cache.

This package is the only one that imports ``ray`` (an optional extra: ``pip install
'prefixroute[ray]'``), and no other package of ours imports it.
"""

from prefixroute.ray_serve._deploy import ROUTER_CLASS, emulated_deployment, router_config
from prefixroute.ray_serve._errors import UnroutableRequest
from prefixroute.ray_serve._key import route_key
from prefixroute.ray_serve._ledger import Ledger
from prefixroute.ray_serve._replica import EmulatedServeReplica
from prefixroute.ray_serve._requests import ChatRequest, CompletionRequest
from prefixroute.ray_serve._router import PrefixRouteRequestRouter
from prefixroute.ray_serve._settings import RouterSettings

__all__ = [
    "ROUTER_CLASS",
    "ChatRequest",
    "CompletionRequest",
    "EmulatedServeReplica",
    "Ledger",
    "PrefixRouteRequestRouter",
    "RouterSettings",
    "UnroutableRequest",
    "emulated_deployment",
    "route_key",
    "router_config",
]
