"""A request body as the gateway reads it: strict JSON, parsed once, keyed by the core.

The key is the core's (:mod:`prefixroute.core.request_key`, shared with the Ray Serve router
and the endpoint picker): chat requests on their messages in order, roles included, so a
conversation's next turn extends the previous turn's key; completions on their prompt, a string
in character mode or token ids in token mode. Text keys are hashed in character mode
(``block_chars`` characters per block): the gateway cannot know each replica's tokenizer, and
a character prefix is a token prefix for any tokenizer, up to the last block. With a tokenizer
(``--tokenizer``), ``_tokenize`` turns a text key into the engine's token ids before routing;
the key keeps the chat messages and ``add_special_tokens`` for that. This module translates the
core's ``InvalidPrompt`` into the gateway's ``BadRequest`` (a 400).

**What goes upstream is what we parsed.** A JSON body is read as strict UTF-8 (Python's decoder
would also take UTF-16 and UTF-32, which a replica may not), without ``NaN``/``Infinity`` (not
JSON), numbers that overflow a double (``1e999`` is JSON, but would go out as ``Infinity``)
and lone surrogates (not Unicode), and is sent to the replica re-encoded from the parsed object
(:func:`encode_body`). So the replica reads exactly the fields the gateway routed
and admitted on: a duplicate key, a compression header or an odd encoding cannot make it read
something else, or fail on input we passed (a failure that would be blamed on the replica).

**A nesting limit.** Python's JSON decoder and encoder recurse once per level, against the
interpreter's recursion limit less the stack already in use, so a body nested a few hundred
levels deep can parse here and fail later: in a re-encode, or in a replica whose stack is deeper
when it parses. The fuzz suite found exactly that: 977 levels passed the gateway and made the
replica answer 500, and those 500s took healthy replicas out of rotation. OpenAI request bodies
nest a few levels (tool schemas a few dozen at most), so anything past ``MAX_DEPTH`` is refused
as invalid JSON.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multidict import CIMultiDict

from prefixroute.core import EMPTY_KEY, Endpoint, InvalidPrompt, ReplicaId, RouteKey
from prefixroute.core import key_of as _core_key_of
from prefixroute.gateway._errors import BadRequest, InvalidJSON, UnsupportedMediaType

if TYPE_CHECKING:
    from prefixroute.gateway._tenants import TenantScope

__all__ = [  # Endpoint, RouteKey and EMPTY_KEY are the core's, named here for the gateway
    "EMPTY_KEY",
    "Admitted",
    "MAX_DEPTH",
    "Endpoint",
    "RouteKey",
    "encode_body",
    "key_of",
    "other_key",
    "parse_body",
    "route_key",
    "too_deep",
]

MAX_DEPTH = 64  # nesting levels of arrays and objects a request body may have
LARGE_BODY = 1024 * 1024  # bytes; aiohttp's threshold for sending bytes in one write


@dataclass(frozen=True, slots=True)
class Admitted:
    """One client request as the handler read it, once: what the proxy routes on and what
    every attempt sends. Nothing downstream reads the request's body, id or tenant again."""

    request_id: str  # the client's or ours (the request-id middleware's; "" outside it)
    endpoint: Endpoint
    key: RouteKey  # with its tenant, seed and adapter (and token ids, with a tokenizer)
    body: bytes  # what a replica gets: the parsed JSON re-encoded, or the body as sent
    headers: CIMultiDict[str]  # what a replica gets (``_tenants.upstream_headers``)
    scope: TenantScope | None  # the tenant's limits: the prompt budget is charged once hashed
    # The gateway asked for the stream's usage the client did not (``_usage``): the relay
    # keeps the usage-only event from the client.
    usage_asked: bool = False
    owner: ReplicaId | None = None  # the one replica it may go to: its stored response's
    # Its answer teaches the router (its first token, its usage): not a stored response's
    # fetch, which computes nothing, and whose usage is the stored answer's (_responses).
    learns: bool = True


# A prompt body declared as one of the types a web page may POST to any origin without a CORS
# preflight (the Fetch standard's safelisted ones) is refused, not read as JSON: reading it let
# any page a user opened send requests here through the user's browser (vLLM and SGLang refuse
# every type but JSON; other types, such as aiohttp's default application/octet-stream for
# bytes, are read as JSON as before).
CROSS_SITE_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)


def is_json_type(media_type: str) -> bool:
    """``application/json`` or a ``+json`` type (``media_type`` lower-cased, no parameters:
    aiohttp's ``request.content_type``)."""
    return media_type == "application/json" or media_type.endswith("+json")


def check_json_type(content_type: str) -> None:
    """UnsupportedMediaType for a prompt body declared (``content_type``, the header's value)
    as a type a web page may send cross-site (module's CROSS_SITE_TYPES)."""
    media = content_type.partition(";")[0].strip().lower()
    if media in CROSS_SITE_TYPES:
        raise UnsupportedMediaType(
            f"the request body must be JSON (Content-Type: application/json), not {media}"
        )


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    """A JSON number as a float, refused when it overflows one: ``1e999`` is valid JSON, but
    parsed it is ``inf``, and re-encoded it would reach the replica as ``Infinity``, which is
    not JSON at all (a strict parser there refuses the request the gateway admitted)."""
    value = float(text)
    if value in (math.inf, -math.inf):
        short = text if len(text) <= 24 else text[:21] + "..."
        raise ValueError(f"the number {short} is out of range (beyond a double)")
    return value


def parse_body(body: bytes) -> object:
    """The JSON value of a request body; raises InvalidJSON (see the module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from exc
    if too_deep(body, obj):  # deep bodies fail later, elsewhere (module docstring)
        raise InvalidJSON(f"the request body nests more than {MAX_DEPTH} levels deep")
    return obj


def too_deep(body: bytes, obj: object, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (parsed from ``body``) nests arrays/objects more than ``limit`` deep."""
    if body.count(b"[") + body.count(b"{") <= limit:  # C-speed answer for almost every body
        return False
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            children: Iterable[object] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def encode_body(obj: object) -> bytes:
    """``obj`` as the bytes a replica gets: compact UTF-8 JSON; InvalidJSON for a string with
    a lone surrogate (``"\\ud800"`` parses, but is no Unicode text a replica can encode)."""
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:  # (a ValueError too: first)
        raise InvalidJSON("the request body holds a lone surrogate (not Unicode text)") from None
    except ValueError as exc:  # NaN or infinity: parse_body lets none in, a caller might
        raise InvalidJSON(f"the request body holds a number JSON cannot carry: {exc}") from None


def route_key(endpoint: Endpoint, body: bytes) -> RouteKey:
    """The routing key of a request body; raises InvalidJSON or BadRequest."""
    return key_of(endpoint, parse_body(body))


def key_of(endpoint: Endpoint, obj: object) -> RouteKey:
    """The routing key of a parsed request body; raises BadRequest."""
    if not isinstance(obj, Mapping):
        raise BadRequest("the request body must be a JSON object")
    try:
        return _core_key_of(endpoint, obj)
    except InvalidPrompt as exc:
        raise BadRequest(str(exc)) from None


def other_key(obj: object | None) -> RouteKey:
    """Any other /v1 call routes on load alone, among the replicas serving its model (a body
    that is not a JSON object, or has no string model, may go to any replica)."""
    model = obj.get("model") if isinstance(obj, dict) else None
    return RouteKey("", None, model) if isinstance(model, str) else EMPTY_KEY


def payload_of(body: bytes) -> bytes | io.BytesIO | None:
    """The body as aiohttp should send it: bytes are written in one go, which aiohttp warns
    about past 1 MiB (it would hold the loop), so larger ones go as a stream, a fresh one per
    attempt so that a retry sends it again from the start."""
    if len(body) > LARGE_BODY:
        return io.BytesIO(body)
    return body or None
