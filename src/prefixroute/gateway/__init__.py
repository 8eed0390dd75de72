"""The gateway: an OpenAI-compatible proxy that routes each request with one core Router.

In-process (tests, ``prefixroute bench``)::

    from prefixroute.gateway import Gateway, GatewayConfig

    async with Gateway(GatewayConfig(port=0, replicas=tuple(urls), policy="round_robin")) as gw:
        gw.url   # "http://127.0.0.1:41234"

From the command line: ``prefixroute serve --replica URL [--replica URL ...] [--policy NAME]``.
"""

from prefixroute._serving import run_on_uvloop
from prefixroute.gateway._accounting import FirstTokenGuess, guess_first_token
from prefixroute.gateway._accounting import end as end_accounting
from prefixroute.gateway._admin import admin_listener
from prefixroute.gateway._app import build_app, gateway_state
from prefixroute.gateway._auth import API_KEY_HEADER, generate_api_key, hash_api_key
from prefixroute.gateway._config import (
    ADMIN_TOKEN_ENV,
    SYNC_SECRET_ENV,
    UPSTREAM_API_KEY_ENV,
    ConfigField,
    GatewayConfig,
    Setting,
    config_fields,
)
from prefixroute.gateway._config_file import (
    CONFIG_HELP,
    MAX_SECRET_CHARS,
    build_config,
    load_toml,
    read_bounded,
    read_secret,
)
from prefixroute.gateway._context_window import (
    fitting,
    learned_window,
    needed_tokens,
    window_said,
)
from prefixroute.gateway._errors import (
    Overloaded,
    PayloadTooLarge,
    Shed,
    error_body,
    error_response,
    is_anthropic,
    spec_for,
)
from prefixroute.gateway._fleetview import DecisionEntry, FleetView
from prefixroute.gateway._health import HealthChecker
from prefixroute.gateway._metrics import GatewayMetrics
from prefixroute.gateway._paths import PROMPT_ENDPOINTS, is_model_call
from prefixroute.gateway._proxy import (
    PREDICTED_HEADER,
    REASON_HEADER,
    REPLICA_HEADER,
    TURNED_AWAY,
)
from prefixroute.gateway._registry import (
    ReplicaRecord,
    ReplicaRegistry,
    ReplicaStatus,
    by_replica,
    normalize_url,
)
from prefixroute.gateway._requests import check_json_type, encode_body, key_of, parse_body
from prefixroute.gateway._responses import ResponseOwners, pinned
from prefixroute.gateway._server import Gateway
from prefixroute.gateway._sse import SSEScanner, is_event_stream_type
from prefixroute.gateway._state import GatewayState
from prefixroute.gateway._tenant_config import TenancyConfig, TenantLimits, TenantSpec
from prefixroute.gateway._tenants import Tenants, TenantScope, isolated, upstream_headers
from prefixroute.gateway._tokenize import HFTokenizer, PromptTokenizer, TokenizerPool
from prefixroute.gateway._tracing import RequestTracing
from prefixroute.gateway._upstream_answers import busy_answer
from prefixroute.gateway._usage import (
    Usage,
    answer_in_body,
    refuses_stream_options,
    usage_in_body,
)
from prefixroute.gateway._verdict import GATEWAY_STATUSES, judge_error_event

# The request-side and response-side pieces below are also what ``prefixroute.epp`` (the Envoy
# endpoint picker) routes and accounts with, so that both front ends parse and learn alike:
# ``parse_body`` and ``key_of`` read a body under the gateway's strict JSON rules into the
# core's ``RouteKey`` (``prefixroute.core.request_key``).
__all__ = [
    "ADMIN_TOKEN_ENV",
    "API_KEY_HEADER",
    "CONFIG_HELP",
    "MAX_SECRET_CHARS",
    "GATEWAY_STATUSES",
    "PREDICTED_HEADER",
    "PROMPT_ENDPOINTS",
    "REASON_HEADER",
    "REPLICA_HEADER",
    "TURNED_AWAY",
    "SYNC_SECRET_ENV",
    "UPSTREAM_API_KEY_ENV",
    "ConfigField",
    "DecisionEntry",
    "FleetView",
    "Gateway",
    "GatewayConfig",
    "GatewayMetrics",
    "GatewayState",
    "ResponseOwners",
    "HFTokenizer",
    "HealthChecker",
    "Overloaded",
    "PayloadTooLarge",
    "Shed",
    "PromptTokenizer",
    "ReplicaRecord",
    "ReplicaRegistry",
    "ReplicaStatus",
    "RequestTracing",
    "Setting",
    "SSEScanner",
    "TenancyConfig",
    "TenantLimits",
    "TenantScope",
    "TenantSpec",
    "Tenants",
    "TokenizerPool",
    "Usage",
    "FirstTokenGuess",
    "admin_listener",
    "answer_in_body",
    "build_app",
    "build_config",
    "by_replica",
    "check_json_type",
    "config_fields",
    "encode_body",
    "end_accounting",
    "error_body",
    "error_response",
    "fitting",
    "gateway_state",
    "generate_api_key",
    "guess_first_token",
    "hash_api_key",
    "is_anthropic",
    "is_event_stream_type",
    "is_model_call",
    "judge_error_event",
    "busy_answer",
    "key_of",
    "learned_window",
    "load_toml",
    "needed_tokens",
    "normalize_url",
    "isolated",
    "parse_body",
    "pinned",
    "read_bounded",
    "read_secret",
    "refuses_stream_options",
    "run_on_uvloop",
    "spec_for",
    "upstream_headers",
    "usage_in_body",
    "window_said",
]
