"""Which client paths may reach a replica, and the exact target the gateway sends upstream.

The gateway used to forward ``/v1/{anything}`` with the client's raw path appended to the
replica's URL. The client library (yarl) then removed dot segments *after* our checks, so
``POST /v1/%2e%2e/reset_prefix_cache`` reached the engine's cache reset, and
``/v1/chat/%2e%2e/completions`` reached ``/v1/completions`` around tenant admission. Two
layers close that, each sufficient on its own:

* **Refuse ambiguous paths** (:func:`make_path_middleware`, before authentication): a raw
  request target whose path, as sent, decoded once or decoded twice, holds a dot segment, an
  empty segment, a backslash, an encoded slash or backslash, a control character, ``;`` path
  parameters, ``?`` or ``#``, or bytes that are not ASCII, is a plain JSON 404. Twice, because
  ``%252e`` is ``%2e`` after one decode: a server or library that decodes once more would see a
  dot. Any escape still left after the second decode (triple encoding) is refused too. No path
  of ours needs any of these, so refusing them costs nothing. The request target must be in
  origin form (``/...``): for an absolute form (``http://host/...``) aiohttp normalises the path
  itself before any check could see it.
* **Never forward the client's string** (:func:`upstream_target`): the path sent upstream is the
  matched route's own canonical path (exact routes only, never a ``{tail}``), and the query is
  re-encoded from the parsed ``request.query``. So even a path that slipped through the first
  layer would reach only the endpoint its route names.

The allowlist itself is the route table: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/responses``, ``/v1/messages`` and SGLang's ``/generate`` (full admission: tenant, salt,
limits, routing on the prompt), ``/v1/models`` (answered here), :data:`PASSTHROUGH_PATHS`, routed
on load alone, and a stored response's ``GET /v1/responses/{id}`` and ``POST
/v1/responses/{id}/cancel``, sent to the replica that stored it (:data:`STORED_RESPONSE_PATHS`).
vLLM's OpenAI server also serves engine controls (``/reset_prefix_cache``, ``/sleep``,
``/v1/load_lora_adapter``, ``/collective_rpc``) and internals (``/metrics``, ``/health``,
``/server_info``); none of them is on the list, and every other path under ``/v1/`` is the
catch-all's 404.

One exception to the segment rules: the admin API names a replica by its URL-quoted URL in one
segment (``/admin/replicas/http%3A%2F%2F10.0.0.11%3A8000/drain``), which decodes to slashes and
an empty segment. That segment is a lookup key, never forwarded, so it is checked only for
control characters, backslashes and being a dot segment itself; the rest of the path gets the
full check.
"""

from __future__ import annotations

import re
from enum import StrEnum
from urllib.parse import unquote_to_bytes

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from prefixroute.core import Endpoint

# Routed on their prompt, and the call each is: OpenAI's three, Anthropic's Messages (vLLM
# serves it), and SGLang's native one (its own request and answer shapes: text or input_ids in,
# meta_info out).
PROMPT_ENDPOINTS = {
    "/v1/completions": Endpoint.COMPLETIONS,
    "/v1/chat/completions": Endpoint.CHAT,
    "/generate": Endpoint.GENERATE,
    "/v1/responses": Endpoint.RESPONSES,
    "/v1/messages": Endpoint.MESSAGES,
}
PROMPT_PATHS = tuple(PROMPT_ENDPOINTS)
# Model calls with a JSON body that carry no prefix worth routing on (one pass over a short
# input, no decoding): forwarded on load alone, after tenant authentication and rate limits.
# vLLM's embeddings, Anthropic token counting, re-rank (Jina's and Cohere's paths), score,
# pooling and classification, and its tokenizer: the set vLLM's production-stack router
# forwards (vllm_router/routers/main_router.py), plus the pooling calls it added since.
# Audio transcription (multipart uploads, which we do not parse) is not among them.
PASSTHROUGH_PATHS = (
    "/v1/embeddings",
    "/v1/messages/count_tokens",
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
)
FORWARDED_PATHS = frozenset(PROMPT_PATHS + PASSTHROUGH_PATHS)  # all that upstream_target sends
_MODEL_CALLS = frozenset(p for p in FORWARDED_PATHS if not p.startswith("/v1/"))
# A stored response, on the replica that stored it (gateway/_responses.py): these two routes'
# paths are built from their validated id, never copied from the client.
STORED_RESPONSE_PATHS = {
    "/v1/responses/{response_id}": "/v1/responses/{}",
    "/v1/responses/{response_id}/cancel": "/v1/responses/{}/cancel",
}
RESPONSE_ID = re.compile(r"\A[A-Za-z0-9_-]{1,256}\Z")  # vLLM's are resp_ and hex digits

_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # NUL, CR, LF, tab, ... DEL
_ENCODED_SEPARATOR = re.compile(r"%(2f|5c)", re.IGNORECASE)
# /admin/replicas/{ref} and /admin/replicas/{ref}/drain: ref is one opaque, quoted segment.
_ADMIN_REF = re.compile(r"\A/admin/replicas/([^/]+)(/drain)?\Z")


class PathProblem(StrEnum):
    """Why a request path is refused (for logs and tests; the client sees a plain 404)."""

    NOT_ORIGIN_FORM = "not_origin_form"  # the target does not start with "/"
    NOT_ASCII = "not_ascii"  # decodes to bytes outside ASCII
    OVER_ENCODED = "over_encoded"  # still holds an escape after two decodes
    CONTROL_CHAR = "control_char"  # NUL, CR, LF, tab, DEL, ...
    BACKSLASH = "backslash"
    ENCODED_SEPARATOR = "encoded_separator"  # %2f or %5c
    PATH_PARAMS = "path_params"  # ";" (Tomcat-style matrix parameters, "..;/")
    DELIMITER = "delimiter"  # "?" or "#" inside the path (after decoding)
    DOT_SEGMENT = "dot_segment"  # "." or ".."
    EMPTY_SEGMENT = "empty_segment"  # "//", or a trailing "/"


def is_model_call(path: str) -> bool:
    """Whether ``path`` is a call for a model, counted in ``prefixroute_requests_total``: every
    ``/v1/`` path but the models list (an unknown one too: its 404 is counted), ``/generate``
    and the passthrough calls outside ``/v1/`` (``/rerank``, ``/tokenize``...)."""
    return (path.startswith("/v1/") and path != "/v1/models") or path in _MODEL_CALLS


def path_problem(raw_target: str) -> PathProblem | None:
    """What is wrong with the path of ``raw_target`` (a request target as sent), or None."""
    path = raw_target.partition("?")[0]
    if not path.startswith("/"):
        return PathProblem.NOT_ORIGIN_FORM
    opaque: str | None = None
    admin = _ADMIN_REF.match(path)
    if admin is not None:
        opaque = admin.group(1)
        path = path[: admin.start(1)] + "ref" + path[admin.end(1) :]
    problem = _check(path, segments=True)
    if problem is None and opaque is not None:
        problem = _check(opaque, segments=False)
    return problem


def _check(raw: str, *, segments: bool) -> PathProblem | None:
    """Check ``raw`` as sent, decoded once, and decoded twice."""
    if "%" not in raw:  # nothing to decode (every client path of ours): one stage, not three
        return _check_stage(raw, segments=segments)
    stages = [raw]
    for _ in range(2):
        try:
            stages.append(unquote_to_bytes(stages[-1]).decode("ascii"))
        except UnicodeDecodeError:
            return PathProblem.NOT_ASCII
    if _ESCAPE.search(stages[-1]):
        return PathProblem.OVER_ENCODED
    for stage in stages:
        problem = _check_stage(stage, segments=segments)
        if problem is not None:
            return problem
    return None


def _check_stage(text: str, *, segments: bool) -> PathProblem | None:
    if not text.isascii():
        return PathProblem.NOT_ASCII
    if _CONTROL.search(text):
        return PathProblem.CONTROL_CHAR
    if "\\" in text:
        return PathProblem.BACKSLASH
    if _ENCODED_SEPARATOR.search(text):
        if not segments:
            # The opaque admin segment is a quoted URL: %2F is expected there, %5C is not.
            if "%5c" in text.lower():
                return PathProblem.ENCODED_SEPARATOR
        else:
            return PathProblem.ENCODED_SEPARATOR
    if not segments:
        return PathProblem.DOT_SEGMENT if text in (".", "..") else None
    if ";" in text:
        return PathProblem.PATH_PARAMS
    if "?" in text or "#" in text:
        return PathProblem.DELIMITER
    if text == "/":
        return None  # the root: no route, the catch-all's 404
    for segment in text.split("/")[1:]:
        if segment in (".", ".."):
            return PathProblem.DOT_SEGMENT
        if not segment:
            return PathProblem.EMPTY_SEGMENT
    return None


def make_path_middleware() -> Middleware:
    """Refuse, with a JSON 404 (through the error middleware), every request whose raw path
    :func:`path_problem` finds fault with. Place it after the error middleware and before
    authentication, so a refused path never costs a key check or a rate-limit token."""

    @web.middleware
    async def path_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if path_problem(request.raw_path) is not None:
            raise web.HTTPNotFound()
        return await handler(request)

    return path_middleware


def upstream_target(request: web.Request) -> str:
    """The path and query to send upstream for ``request``: its route's canonical path (one of
    :data:`FORWARDED_PATHS`, or a stored response's, built from its checked id) and its parsed
    query, re-encoded. Never the client's raw string.

    Raises RuntimeError when the matched route is not an exact, forwarded one: a handler that
    proxies from any other route is a bug, and a 500 is better than forwarding it.
    """
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical in STORED_RESPONSE_PATHS:
        response_id = request.match_info["response_id"]
        if not RESPONSE_ID.match(response_id):  # the handler checked it: a bug if not
            raise RuntimeError(f"response id {response_id!r} is not one the gateway forwards")
        path = STORED_RESPONSE_PATHS[resource.canonical].format(response_id)
        return URL.build(path=path, query=request.query).raw_path_qs
    if not isinstance(resource, web.PlainResource) or resource.canonical not in FORWARDED_PATHS:
        raise RuntimeError(f"route {resource!r} is not one the gateway forwards")
    return URL.build(path=resource.canonical, query=request.query).raw_path_qs
