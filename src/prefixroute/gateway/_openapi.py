"""``GET /openapi.json``: the gateway's public surface as an OpenAPI 3.1 document.

The document is a file shipped in the package (``openapi.json`` beside this module), written
by hand: it describes what the gateway promises its clients (the prompt endpoints, the models
list, the passthrough allowlist of ``_paths``, health and metrics, and the OpenAI error body),
not every field a replica may accept. ``tests/gateway/test_paths.py`` runs schemathesis against
the served document, so it cannot drift from what the gateway answers. The path is open (no API
key), like ``/health``.
"""

from __future__ import annotations

import json
from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler

OPENAPI_PATH = "/openapi.json"


def load_openapi() -> bytes:
    """The shipped document, checked to be JSON (a broken file fails at startup, not per call)."""
    body = resources.files("prefixroute.gateway").joinpath("openapi.json").read_bytes()
    json.loads(body)
    return body


def make_openapi_handler() -> Handler:
    """A handler that serves the document, read once when the app is built."""
    body = load_openapi()

    async def openapi(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return openapi
