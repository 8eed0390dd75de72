"""The live fleet page: ``GET /dashboard``, its two assets, and ``GET /dashboard/state.json``.

The page (``dashboard/`` beside this module: HTML, CSS and hand-written JS drawing SVG, no
library and nothing from a CDN, since clusters are often offline) polls ``state.json`` once a
second (``_fleetview`` describes the document) and draws per-replica tables and charts of the
last minutes. ``prefixroute top`` reads the same document.

Who may look. The page shows replica addresses, load and routing decisions, so it is an admin
surface:

* With an admin token, every path here needs it, as ``Authorization: Bearer <token>`` (``top``,
  curl) or as the password of HTTP Basic auth (any user name): a browser cannot add a bearer
  header to a page it navigates to, but it asks for Basic credentials itself when the page
  answers 401 with a Basic challenge, and then sends them with the page's own requests. The
  token is compared in constant time, by digest (``_auth.secrets_equal``), as the admin API's.
  With ``admin_port`` the page is served on the admin listener only, like ``/admin/*``
  (``_admin.admin_listener``, which the endpoint picker's HTTP listener is too).
* Without an admin token the page is mounted only when the gateway listens on a loopback
  address (``127.0.0.1``, ``::1``, ``localhost``), and answers loopback peers only: the
  ``prefixroute serve`` of a laptop gets its page with no setup, and a gateway bound to a
  routable address publishes nothing without a token. A proxy on the same host that forwards
  to a loopback-bound gateway would publish it: set a token there.

Answers carry ``Cache-Control: no-store`` and a ``Content-Security-Policy`` that allows this
origin's script and style only and no framing.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
import json
import math
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler

from prefixroute.gateway._admission import expect_handler
from prefixroute.gateway._auth import bearer_token, secrets_equal
from prefixroute.gateway._config import GatewayConfig
from prefixroute.gateway._errors import ERROR_TABLE, BadRequest, Unauthorized, error_body
from prefixroute.gateway._fleetview import FLEET, fleet_state
from prefixroute.gateway._state import STATE

DASHBOARD_PATH = "/dashboard"
STATE_PATH = "/dashboard/state.json"
# Served name -> (file in the package's dashboard/ folder, content type).
ASSETS = {
    DASHBOARD_PATH: ("index.html", "text/html"),
    "/dashboard/app.js": ("app.js", "text/javascript"),
    "/dashboard/app.css": ("app.css", "text/css"),
}
LOOPBACK_NAMES = frozenset({"localhost"})
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
BASIC_CHALLENGE = 'Basic realm="prefixroute dashboard", charset="UTF-8"'
BEARER_CHALLENGE = 'Bearer realm="prefixroute dashboard"'
_compact = functools.partial(json.dumps, separators=(",", ":"))


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if not host:
        return False
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").partition("%")[0]).is_loopback
    except ValueError:
        return False


def mounted_on(config: GatewayConfig, host: str) -> bool:
    """Whether a listener bound to ``host`` that serves the admin surfaces serves the page:
    with an admin token, or without one on a loopback address (for loopback clients only)."""
    return config.admin_token is not None or is_loopback(host)


def mounted_on_main(config: GatewayConfig) -> bool:
    """Whether the main listener serves the page (else the admin listener, or nobody)."""
    if config.admin_port is not None:
        return False  # with a token, on the admin listener (build_admin_app)
    return mounted_on(config, config.host)


def add_routes(app: web.Application) -> None:
    """The page, its assets and the state document; reads the assets now (a missing file
    fails at startup, not per request)."""
    eh = expect_handler
    for path, (name, ctype) in ASSETS.items():
        body = resources.files("prefixroute.gateway").joinpath("dashboard", name).read_bytes()
        app.router.add_get(path, _asset_handler(body, ctype), expect_handler=eh)
    app.router.add_get(STATE_PATH, state_json, expect_handler=eh)


def basic_password(authorization: str) -> str | None:
    """The password of an ``Authorization: Basic <base64(user:password)>`` header, else None."""
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "basic" or not credential:
        return None
    try:
        decoded = base64.b64decode(credential.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return password if sep and password else None


def _refusal(request: web.Request, challenge: str) -> web.Response | None:
    """None when the request may see the dashboard, else the answer that refuses it."""
    token = request.app[STATE].config.admin_token
    if token is None:
        if is_loopback(request.remote):
            return None
        body = error_body(
            "the dashboard answers loopback clients only when no admin token is set",
            "permission_error", "forbidden",
        )  # fmt: skip
        return web.json_response(body, status=403, headers=SECURITY_HEADERS, dumps=_compact)
    header = request.headers.get("Authorization", "")
    given = bearer_token(header)
    if given is None:
        given = basic_password(header)
    # Compare even when nothing came, so timing does not tell which part failed.
    match = secrets_equal(given or "", token)
    if given is not None and match:
        return None
    spec = ERROR_TABLE[Unauthorized]
    body = error_body("a valid admin token is required", spec.type, spec.code)
    headers = {**SECURITY_HEADERS, "WWW-Authenticate": challenge}
    return web.json_response(body, status=spec.status, headers=headers, dumps=_compact)


def _asset_handler(body: bytes, content_type: str) -> Handler:
    async def asset(request: web.Request) -> web.StreamResponse:
        refused = _refusal(request, BASIC_CHALLENGE)  # a browser asks for the token itself
        if refused is not None:
            return refused
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS
        )

    return asset


async def state_json(request: web.Request) -> web.StreamResponse:
    """The fleet's state; ``?since=T`` (Unix seconds) keeps only chart samples after T."""
    refused = _refusal(request, BEARER_CHALLENGE)
    if refused is not None:
        return refused
    since: float | None = None
    raw = request.query.get("since")
    if raw is not None:
        try:
            since = float(raw)
            if not math.isfinite(since):
                raise ValueError(raw)
        except ValueError:
            raise BadRequest("since must be a number of seconds (Unix time)") from None
    doc = fleet_state(request.app[STATE], request.app[FLEET], since)
    return web.json_response(doc, headers=SECURITY_HEADERS, dumps=_compact)
