"""The gateway: an OpenAI-compatible proxy that routes each request with one core Router.

In-process (tests, ``prefixroute bench``)::

    from prefixroute.gateway import Gateway, GatewayConfig

    async with Gateway(GatewayConfig(port=0, replicas=tuple(urls), policy="round_robin")) as gw:
        gw.url   # "http://127.0.0.1:41234"

From the command line: ``prefixroute serve --replica URL [--replica URL ...] [--policy NAME]``.
"""

from prefixroute.gateway._app import build_app
from prefixroute.gateway._auth import generate_api_key, hash_api_key
from prefixroute.gateway._config import CONFIG_HELP, GatewayConfig, build_config, load_toml
from prefixroute.gateway._registry import ReplicaRecord, ReplicaRegistry, ReplicaStatus
from prefixroute.gateway._server import Gateway
from prefixroute.gateway._tenant_config import TenancyConfig, TenantLimits, TenantSpec
from prefixroute.gateway._tokenize import HFTokenizer, PromptTokenizer

__all__ = [
    "CONFIG_HELP",
    "Gateway",
    "GatewayConfig",
    "HFTokenizer",
    "PromptTokenizer",
    "ReplicaRecord",
    "ReplicaRegistry",
    "ReplicaStatus",
    "TenancyConfig",
    "TenantLimits",
    "TenantSpec",
    "build_app",
    "build_config",
    "generate_api_key",
    "hash_api_key",
    "load_toml",
]
