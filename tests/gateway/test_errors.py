from __future__ import annotations

import json

from aiohttp import web

from prefixroute.core import ConfigError, NoReplicaAvailable, PrefixrouteError, UnknownPolicy
from prefixroute.gateway._errors import (
    ERROR_TABLE,
    INTERNAL,
    InvalidJSON,
    ModelNotFound,
    UpstreamTimeout,
    error_response,
    spec_for,
)


def test_lookup_walks_the_mro() -> None:
    assert spec_for(InvalidJSON("x")).status == 400
    assert spec_for(UnknownPolicy("x")).status == 400  # via ConfigError
    assert spec_for(ModelNotFound("x")).status == 404
    assert spec_for(UpstreamTimeout("x")).status == 504
    assert spec_for(NoReplicaAvailable("x")).status == 503
    assert spec_for(PrefixrouteError("x")).status == 500
    assert spec_for(KeyError("x")) is INTERNAL


def test_every_row_is_a_prefixroute_error() -> None:
    assert all(issubclass(cls, PrefixrouteError) for cls in ERROR_TABLE)


def test_bodies_are_openai_style_and_hide_foreign_text() -> None:
    resp = error_response(ConfigError("bad value"), 1)
    assert resp.status == 400
    assert resp.text is not None
    body = json.loads(resp.text)
    assert body["error"]["message"] == "bad value"
    assert set(body["error"]) == {"message", "type", "param", "code"}
    leaked = error_response(RuntimeError("/secret/path"), 1)
    assert leaked.status == 500
    assert leaked.text is not None and "/secret" not in leaked.text
    assert error_response(NoReplicaAvailable("x"), 3).headers["Retry-After"] == "3"
    assert error_response(web.HTTPMethodNotAllowed("GET", ["POST"]), 1).status == 405
