"""Reading ``usage`` from replica responses: prompt, completion and cached tokens.

vLLM reports the engine's real prefix-cache hit in ``usage.prompt_tokens_details.cached_tokens``
(with ``--enable-prompt-tokens-details``); SGLang and OpenAI use the same fields, and SGLang's
native ``/generate`` puts the same counts in ``meta_info``. The router
learns each replica's speed from them (``Router.observe_usage`` and ``complete``). The gateway
only reads: the bytes it relays are never re-encoded, so parsing happens on a copy the client
never sees.

**Streams report usage only when asked** (``stream_options.include_usage``), and most streaming
clients do not ask, so without help the router would learn nothing from them: no cached tokens
to check its predictions against, no completion tokens for the decode phase, no characters per
token. :func:`ask_for_stream_usage` asks on the client's behalf (``stream_usage``, on by default)
and the relay then keeps the usage-only event it asked for (``choices: []``) from the client
(:class:`~prefixroute.gateway._sse.SSEScanner`), which sees the stream it asked for. Many
clients index ``choices[0]`` of every chunk and fail on that event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec

from prefixroute._usage_counts import Usage, usage_of
from prefixroute.core.prompt_key import lax_bool
from prefixroute.gateway._requests import encode_body

__all__ = ["Usage", "usage_of"]  # read here by the gateway and the picker (_usage_counts)


def ask_for_stream_usage(obj: object) -> bool:
    """Ask the replica for a stream's usage when the client did not: sets
    ``stream_options.include_usage`` in the parsed body ``obj`` (in place) and returns True, and
    the usage-only event is then the gateway's to keep from the client. Left alone (False): not
    a stream, a client that asked already, one that turned ``continuous_usage_stats`` on (its
    own usage protocol), or ``stream_options`` that is not an object (the replica's to refuse).
    A ``stream_options`` object without ``include_usage`` is left as sent too: the engines
    disagree on what it means (SGLang's ``StreamOptions`` defaults it to true, vLLM 0.32's to
    false), so whether the client expects the usage event cannot be told, and the engine's
    answer goes to it as it came (the router learns that stream's usage only if there is one).
    Their booleans are read as the engines read them (``lax_bool``: ``1`` and ``"true"`` are true),
    and one they would refuse is left for them to refuse."""
    if not isinstance(obj, dict) or lax_bool(obj.get("stream")) is not True:
        return False
    options = obj.get("stream_options")
    if options is None:
        obj["stream_options"] = {"include_usage": True}
        return True
    if not isinstance(options, dict):
        return False
    for name, default in (("include_usage", True), ("continuous_usage_stats", None)):
        value = options.get(name, default)
        if value is not None and lax_bool(value) is not False:  # on, or not a boolean
            return False
    options["include_usage"] = True
    return True


def refuses_stream_options(body: bytes) -> bool:
    """A replica's 400 that refuses the ``stream_options`` the gateway added: it names them
    (a server that rejects fields it does not know)."""
    return b"stream_options" in body


def without_stream_usage(body: bytes) -> bytes:
    """``body`` (as the gateway encoded it, having asked for usage) without that ask: the
    ``include_usage`` set, and ``stream_options`` itself when nothing else is left in it."""
    obj = json.loads(body)
    options = obj.get("stream_options") if isinstance(obj, dict) else None
    if isinstance(options, dict):
        options.pop("include_usage", None)
        if not options:
            del obj["stream_options"]
    return encode_body(obj)


def is_usage_only(obj: object) -> bool:
    """A stream's usage event (OpenAI's, vLLM's and SGLang's): no choices, a usage object."""
    return (
        isinstance(obj, Mapping)
        and obj.get("choices") == []
        and isinstance(obj.get("usage"), Mapping)
    )


class _Top(msgspec.Struct):
    """The top-level fields of an answer that :func:`usage_of` and a stored response's id are
    read from, each kept raw (parsed only if present); every other field is skipped unparsed."""

    usage: msgspec.Raw = msgspec.Raw()
    meta_info: msgspec.Raw = msgspec.Raw()
    response: msgspec.Raw = msgspec.Raw()
    type: msgspec.Raw = msgspec.Raw()
    message: msgspec.Raw = msgspec.Raw()
    id: msgspec.Raw = msgspec.Raw()
    object: msgspec.Raw = msgspec.Raw()


_top = msgspec.json.Decoder(_Top)
WHOLE_PARSE_BYTES = 1 << 20  # a body msgspec refuses is parsed whole by json up to this size


def _top_fields(body: bytes) -> dict[str, object] | None:
    """The fields of :class:`_Top` that ``body`` has, parsed; None when it is not a JSON
    object. An answer of tens of megabytes (vLLM's ``echo`` with ``logprobs``) took 1.5 s of
    the event loop in ``json.loads`` to read its usage (an outside audit, 2026-12-07); its
    choices are now skipped unparsed. What msgspec refuses and json reads (``NaN``) is read
    whole below ``WHOLE_PARSE_BYTES``."""
    try:
        top = _top.decode(body)
    except msgspec.ValidationError:  # valid JSON, not an object (a batch's list)
        return None
    except msgspec.DecodeError:
        if len(body) > WHOLE_PARSE_BYTES:
            return None
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
        return obj if isinstance(obj, dict) else None
    fields = {}
    for name in _Top.__struct_fields__:
        raw = getattr(top, name)
        if len(raw):  # (empty: absent)
            fields[name] = json.loads(bytes(raw))
    return fields


def usage_in_body(body: bytes) -> Usage | None:
    """The usage in a whole JSON response body (None when absent or not JSON)."""
    if b'"usage"' not in body and b'"meta_info"' not in body:  # most skip the parse
        return None
    return usage_of(_top_fields(body))


def answer_in_body(body: bytes) -> tuple[Usage | None, str | None]:
    """A whole answer's usage and, for a Responses API answer (``"object": "response"``), its
    id, from one parse; (None, None) for a body that mentions neither or is not JSON."""
    if b'"usage"' not in body and b'"meta_info"' not in body and b'"response"' not in body:
        return None, None
    obj = _top_fields(body)
    if obj is None:
        return None, None
    stored = obj.get("id") if obj.get("object") == "response" else None
    return usage_of(obj), stored if isinstance(stored, str) else None


def cached_tokens_of(obj: object) -> int | None:
    """The cached-token count in a parsed response or stream chunk, or None when absent."""
    usage = usage_of(obj)
    return usage.cached_tokens if usage is not None else None


def cached_tokens_in_body(body: bytes) -> int | None:
    """The cached-token count in a whole JSON response body (None when absent or not JSON)."""
    usage = usage_in_body(body)
    return usage.cached_tokens if usage is not None else None
